"""Version of kiln-guards."""

__version__ = "0.1.0"
