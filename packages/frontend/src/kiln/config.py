"""What a user may pass to ``kiln.compile``, checked before anything is compiled.

Bad input is caught here with errors that name the option and the valid choices, so a typo
never silently compiles something other than what the user asked for.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

__all__ = ["MODES", "OPTIONS", "BACKEND_OPTIONS", "CompileConfig", "make_config"]

MODES: tuple[str, ...] = (
    "default",
    "reduce-overhead",
    "max-autotune",
    "max-autotune-no-cudagraphs",
)

# option key -> (type, help). Dotted keys address one package's settings.
OPTIONS: dict[str, tuple[type, str]] = {
    "recompile_limit": (int, "cache entries per code object before the frame runs eagerly"),
    "fail_on_recompile_limit": (bool, "raise instead of running eagerly past the recompile limit"),
    "automatic_dynamic_shapes": (
        bool,
        "with dynamic=None, capture a size that changed between calls as a symbol",
    ),
    "capture_scalar_outputs": (
        bool,
        "capture t.item(), int(t) and t.tolist() as unbacked symbols instead of graph breaks",
    ),
    "capture_dynamic_output_shape_ops": (
        bool,
        "capture nonzero, unique, masked_select and x[mask] with data-dependent sizes",
    ),
    "dynamic_kernels": (
        bool,
        "let the default backend compile a graph with symbolic sizes once (default: on; "
        "off: per size)",
    ),
    "skip_guards": (bool, "UNSAFE: run the newest entry without checking guards"),
    "debug_dir": (str, "dump artifacts of every compiled frame into this folder"),
    "repro": (str, "write repro.py for a graph that fails: after_capture or after_aot"),
    "repro_level": (str, "what fails for repro: exception (default) or accuracy"),
    "graph_cache": (
        bool,
        "reuse compiled graphs across processes (default: on unless KILN_GRAPH_CACHE=0)",
    ),
    "max_autotune": (bool, "benchmark more kernel configurations and matmul templates"),
    "cudagraphs": (bool, "capture compiled graphs into CUDA graphs when safe"),
    "fusion": (bool, "let the scheduler fuse kernels"),
    "freezing": (
        bool,
        "CPU inference: compute what depends on parameters and buffers alone once, batch norm "
        "folded into convolutions (default: where no parameter or buffer requires grad)",
    ),
    "cpp.threads": (int, "OpenMP threads for C++ kernels (default: torch.get_num_threads())"),
    "cpp.simd": (bool, "emit vectorized inner loops in C++ kernels"),
}

BACKEND_OPTIONS: tuple[str, ...] = (
    "max_autotune",
    "cudagraphs",
    "fusion",
    "freezing",
    "cpp.threads",
    "cpp.simd",
)
"""Options the backend reads (passed to it as ``options=``); the rest steer the frontend."""

_MODE_OPTIONS: dict[str, dict[str, Any]] = {
    "default": {},
    "reduce-overhead": {"cudagraphs": True},
    "max-autotune": {"max_autotune": True, "cudagraphs": True},
    "max-autotune-no-cudagraphs": {"max_autotune": True},
}


@dataclasses.dataclass(frozen=True)
class CompileConfig:
    """The checked settings of one ``kiln.compile`` call.

    Unlike PyTorch's own compiler, a mode and explicit options may be combined: the options refine
    what the mode implies.
    """

    fullgraph: bool = False
    dynamic: bool | None = None
    mode: str = "default"
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def option(self, key: str, default: Any = None) -> Any:
        """The option's value: explicit options win over those the mode implies."""
        if key in self.options:
            return self.options[key]
        return _MODE_OPTIONS[self.mode].get(key, default)

    def backend_options(self) -> dict[str, Any]:
        """The backend's share of the options, those the mode implies included."""
        resolved = {**_MODE_OPTIONS[self.mode], **self.options}
        return {key: value for key, value in resolved.items() if key in BACKEND_OPTIONS}


def make_config(
    *,
    fullgraph: Any,
    dynamic: Any,
    mode: Any,
    options: Any,
) -> CompileConfig:
    """Check ``kiln.compile``'s keyword arguments and build the config they describe."""
    if not isinstance(fullgraph, bool):
        msg = f"kiln.compile: fullgraph must be a bool, got {type(fullgraph).__name__}"
        raise TypeError(msg)
    if dynamic is not None and not isinstance(dynamic, bool):
        msg = f"kiln.compile: dynamic must be None, True or False, got {dynamic!r}"
        raise TypeError(msg)
    if mode is None:
        mode = "default"
    if not isinstance(mode, str) or mode not in MODES:
        msg = f"kiln.compile: unknown mode {mode!r}; valid modes: {', '.join(MODES)}"
        raise ValueError(msg)
    return CompileConfig(fullgraph, dynamic, mode, _check_options(options))


def _check_options(options: Any) -> dict[str, Any]:
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        msg = f"kiln.compile: options must be a dict, got {type(options).__name__}"
        raise TypeError(msg)
    checked: dict[str, Any] = {}
    for key, value in options.items():
        if key not in OPTIONS:
            valid = ", ".join(sorted(OPTIONS))
            msg = f"kiln.compile: unknown option {key!r}; valid options: {valid}"
            raise ValueError(msg)
        expected, _ = OPTIONS[key]
        # bool is an int subclass: an int option must not accept True, nor a bool option 1.
        wrong = not isinstance(value, expected) or (expected is int and isinstance(value, bool))
        if wrong:
            msg = (
                f"kiln.compile: option {key!r} must be {expected.__name__}, "
                f"got {type(value).__name__} ({value!r})"
            )
            raise TypeError(msg)
        if key == "cpp.threads" and value < 1:
            msg = f"kiln.compile: option 'cpp.threads' must be at least 1, got {value}"
            raise ValueError(msg)
        checked[key] = value
    return checked
