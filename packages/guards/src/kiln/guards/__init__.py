"""kiln.guards: see the package README for its role and public API."""

from kiln.guards.__about__ import __version__

__all__ = ["__version__"]
