"""The package version (one place; the package root and the generator version read it)."""

__version__ = "0.1.0"
