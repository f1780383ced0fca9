import sys

from runner.cli.entry import main

sys.exit(main())
