"""The minifier: a failing graph written as ``repro.py``, then shrunk to the smallest that fails.

``KILN_REPRO=after_capture|after_aot`` says where to watch and ``KILN_REPRO_LEVEL=exception|
accuracy`` what counts as failing (:mod:`kiln.minifier.hooks`); :mod:`~kiln.minifier.graphs`
shrinks a graph by delta debugging over its nodes; :mod:`~kiln.minifier.script` writes it;
:mod:`~kiln.minifier.runner` checks a graph the same way in both processes.
"""

from kiln.minifier.graphs import minify
from kiln.minifier.hooks import settings, watch_backend
from kiln.minifier.runner import Target, TensorSpec, fails, main
from kiln.minifier.script import write_script

__all__ = [
    "Target",
    "TensorSpec",
    "fails",
    "main",
    "minify",
    "settings",
    "watch_backend",
    "write_script",
]
