"""loopir's IR: layouts, computations (``Pointwise``/``Reduction``/``Scatter``), buffers,
views and the boxes lowerings pass around. See the package README."""
