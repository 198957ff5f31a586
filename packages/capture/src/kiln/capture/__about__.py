"""Version of kiln-capture."""

__version__ = "0.1.0"
