"""Kiln: a just-in-time compiler for unmodified PyTorch programs."""

import pkgutil

__path__ = pkgutil.extend_path(__path__, __name__)

from kiln.__about__ import __version__  # noqa: E402

__all__ = ["__version__"]
