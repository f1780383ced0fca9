"""Where models come from: the catalog (models.toml), the local cache, pulling and the executable's embedded model."""
