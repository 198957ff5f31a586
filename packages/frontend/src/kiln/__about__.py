"""Version of the kiln distribution (the frontend)."""

__version__ = "0.1.0"
