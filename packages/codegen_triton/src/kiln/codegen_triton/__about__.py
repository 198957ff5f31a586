"""Version of kiln-codegen-triton."""

__version__ = "0.1.0"
