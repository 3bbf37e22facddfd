"""The --compress choices, light enough for the CLI to import at start (store.py is not)."""

COMPRESS = ("auto", "zstd", "lz4", "none")
