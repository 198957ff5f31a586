"""kiln.codegen_triton: see the package README for its role and public API."""

from kiln.codegen_triton.__about__ import __version__

__all__ = ["__version__"]
