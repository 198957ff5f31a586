"""kiln.autograd_aot: torch-level graphs to functional, decomposed ATen graphs, with training.

See the package README for its role and public API.
"""

from kiln.autograd_aot.__about__ import __version__
from kiln.autograd_aot.aot import AotCompiled, aot_compile
from kiln.autograd_aot.backends import aot_eager, aot_eager_decomp_partition
from kiln.autograd_aot.decomp import default_decompositions, kiln_decompositions
from kiln.autograd_aot.errors import AotError, UnsupportedMutation
from kiln.autograd_aot.partition import PartitionStats
from kiln.autograd_aot.trace import AtenTracer, trace_aten, verify_aten_graph

__all__ = [
    "AotCompiled",
    "AotError",
    "AtenTracer",
    "PartitionStats",
    "UnsupportedMutation",
    "__version__",
    "aot_compile",
    "aot_eager",
    "aot_eager_decomp_partition",
    "default_decompositions",
    "kiln_decompositions",
    "trace_aten",
    "verify_aten_graph",
]
