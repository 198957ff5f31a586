"""kiln.autograd_aot: see the package README for its role and public API."""

from kiln.autograd_aot.__about__ import __version__

__all__ = ["__version__"]
