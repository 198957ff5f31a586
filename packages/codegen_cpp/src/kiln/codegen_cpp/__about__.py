"""Version of kiln-codegen-cpp."""

__version__ = "0.1.0"
