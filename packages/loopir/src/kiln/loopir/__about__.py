"""Version of kiln-loopir."""

__version__ = "0.1.0"
