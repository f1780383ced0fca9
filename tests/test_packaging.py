"""A built wheel carries every subpackage and data file (a non-editable install once lacked the server)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_wheel_holds_every_package_module_and_data_file(tmp_path: Path) -> None:
    tree = tmp_path / "src"  # a copy: building in the checkout would leave build/ and egg-info there
    shutil.copytree(REPO / "runner", tree / "runner", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, tree / name)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(tree)],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    wheel = next(tmp_path.glob("runner-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    source = REPO / "runner"
    expected = {str(p.relative_to(REPO)) for p in source.rglob("*")
                if p.is_file() and "__pycache__" not in p.parts}
    assert expected - names == set()
    assert "runner/catalog/models.toml" in names and "runner/server/app.py" in names


def test_jinja2_is_held_above_its_sandbox_escapes() -> None:
    # CVE-2024-56326 and CVE-2025-27516 were fixed in 3.1.5 and 3.1.6; chat templates come from untrusted GGUFs
    import importlib.metadata
    import tomllib

    requirements = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "jinja2>=3.1.6" in requirements
    assert tuple(int(p) for p in importlib.metadata.version("jinja2").split(".")[:3]) >= (3, 1, 6)
