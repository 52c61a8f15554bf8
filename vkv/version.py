"""The package's version, one place every layer may read it from (files and results record it)."""

__version__ = "0.1.0"
