"""kiln.capture: CPython bytecode to torch.fx graphs, with guards recorded as data.

See the package README for the public API; it works with only this package installed.
"""

from kiln.capture import artifacts, counters
from kiln.capture.__about__ import __version__
from kiln.capture.breaks.resume import is_continuation
from kiln.capture.errors import CaptureError, EagerRaises, KilnError, Unsupported, UserFrame
from kiln.capture.explain import ExplainOutput, explain
from kiln.capture.export import ExportResult, export
from kiln.capture.export_shapes import Dim, DynamicShapesError
from kiln.capture.frame_capture import CaptureResult, GraphBreak, capture
from kiln.capture.guard_data import GlobalState, GuardKind, GuardSpec, TensorMeta
from kiln.capture.source import (
    AttrSource,
    ClosureSource,
    GlobalSource,
    ItemSource,
    LocalSource,
    Source,
)

__all__ = [
    "AttrSource",
    "CaptureError",
    "CaptureResult",
    "EagerRaises",
    "ExplainOutput",
    "ExportResult",
    "ClosureSource",
    "GlobalSource",
    "GlobalState",
    "GraphBreak",
    "GuardKind",
    "GuardSpec",
    "ItemSource",
    "KilnError",
    "LocalSource",
    "Source",
    "TensorMeta",
    "Unsupported",
    "UserFrame",
    "__version__",
    "artifacts",
    "capture",
    "counters",
    "explain",
    "export",
    "is_continuation",
    "Dim",
    "DynamicShapesError",
]
