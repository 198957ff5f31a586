"""Version of kiln-autograd-aot."""

__version__ = "0.1.0"
