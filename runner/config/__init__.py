"""Engine options, declared once: they drive the CLI flags, models.toml keys and server defaults."""
