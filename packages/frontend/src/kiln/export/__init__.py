"""``kiln.export``: a whole program as one ATen graph, checked on every call, saved as one file.

It mirrors PyTorch's own export. :func:`export` captures one call of a module or function as a single
graph (``kiln.capture.export``) and traces it to ATen with decompositions (autograd_aot), for
inference or as the joint forward/backward. The :class:`ExportedProgram` holds the graph, the
parameters and buffers it takes as named inputs, the pytree specs of the arguments and result,
and the dynamic sizes with their ranges; calling it checks the arguments first. :func:`save`
writes one file (weights in safetensors, graph and specs as JSON) that :func:`load` reads in a
process without the user's code, to run eagerly or through ``kiln.compile``.
"""

from kiln.capture.export_shapes import Dim, DynamicShapesError
from kiln.export.build import export
from kiln.export.program import (
    ExportedModule,
    ExportedProgram,
    ExportError,
    ExportInputError,
    ExportSignature,
    InputSpec,
    OutputSpec,
    SymbolSpec,
    TensorSpec,
)
from kiln.export.serialize import load, save

__all__ = [
    "Dim",
    "DynamicShapesError",
    "ExportError",
    "ExportInputError",
    "ExportSignature",
    "ExportedModule",
    "ExportedProgram",
    "InputSpec",
    "OutputSpec",
    "SymbolSpec",
    "TensorSpec",
    "export",
    "load",
    "save",
]
