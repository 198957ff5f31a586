"""kiln.loopir: see the package README for its role and public API."""

from kiln.loopir.__about__ import __version__

__all__ = ["__version__"]
