"""PyTorch's OpInfo database swept through Kiln's default backend (``python -m opinfo``)."""
