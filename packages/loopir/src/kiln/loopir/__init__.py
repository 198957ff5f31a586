"""kiln.loopir: see the package README for its role and public API."""

from kiln.loopir import backend, sizes
from kiln.loopir.__about__ import __version__
from kiln.loopir.attention import fuse_attention
from kiln.loopir.attention_masks import simplify_attention_masks
from kiln.loopir.backend import Backend, BackendTraits, get_backend, register_backend
from kiln.loopir.decompositions import decompositions
from kiln.loopir.entry import (
    GRAPH_WRAPPERS,
    compile_fx,
    load_fx,
    register_graph_wrapper,
    save_fx,
)
from kiln.loopir.errors import (
    BackendError,
    IRVerificationError,
    LoopIRError,
    LoweringError,
    StaticShapesOnly,
)
from kiln.loopir.kernel import RINDEX, SEEDS, XINDEX, KernelCode, KernelGroup, KernelNode
from kiln.loopir.matmul_padding import pad_matmuls
from kiln.loopir.ops import OpsHandler, OpsHandlerBase
from kiln.loopir.pipeline import CompiledGraph, compile_graph, compile_graph_reference
from kiln.loopir.reference import ReferenceBackend
from kiln.loopir.virtualized import V, ops, set_ops_handler
from kiln.loopir.wrapper import current_region, naming_region

__all__ = [
    "RINDEX",
    "SEEDS",
    "XINDEX",
    "Backend",
    "BackendTraits",
    "CompiledGraph",
    "GRAPH_WRAPPERS",
    "BackendError",
    "IRVerificationError",
    "KernelCode",
    "KernelGroup",
    "KernelNode",
    "LoopIRError",
    "LoweringError",
    "OpsHandler",
    "OpsHandlerBase",
    "ReferenceBackend",
    "StaticShapesOnly",
    "V",
    "__version__",
    "backend",
    "compile_fx",
    "compile_graph",
    "compile_graph_reference",
    "current_region",
    "decompositions",
    "fuse_attention",
    "get_backend",
    "load_fx",
    "naming_region",
    "ops",
    "pad_matmuls",
    "register_backend",
    "register_graph_wrapper",
    "save_fx",
    "set_ops_handler",
    "simplify_attention_masks",
    "sizes",
]
