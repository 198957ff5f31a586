"""``KILN_LOGS``: switch Kiln's artifact loggers on by channel name.

Every package logs artifacts on stdlib loggers named ``kiln.<package>.<channel>``
(``kiln.capture.graph_breaks``, ``kiln.loopir.fusion``, ...). A channel name turns on that
channel in every package; ``+kiln`` turns on debug output of all of Kiln. ``kiln`` turns on the
channels that print a line per event and fits on a screen for a small model; the channels that
print whole programs (:data:`PROGRAM_CHANNELS`) print when named, or under ``+kiln`` (and every
program is in ``KILN_DEBUG_DIR`` too). Artifact loggers get their own stderr handler and do not
propagate, so they print once whatever the user's root logging does.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

__all__ = ["CHANNELS", "PACKAGES", "PROGRAM_CHANNELS", "set_logs", "configure_from_env"]

PACKAGES = (
    "capture",
    "guards",
    "autograd_aot",
    "loopir",
    "codegen_triton",
    "codegen_cpp",
    "frontend",
)
CHANNELS: dict[str, str] = {
    "graph": "captured torch-level FX graphs",
    "graph_breaks": "every graph break with its reason and user source line",
    "guards": "the generated guard function of each cache entry",
    "recompiles": "why a frame was compiled again: the first failing guard",
    "bytecode": "original and transformed bytecode, and resume functions",
    "aot": "ATen graphs, decompositions, the forward/backward partition",
    "ir": "loop-level IR of each graph",
    "fusion": "each fusion decision and why",
    "output_code": "generated wrapper and kernel code",
    "build": "C++ compiler invocations and cache hits",
    "autotune": "kernel configurations tried and chosen",
    "perf_hints": "places where Kiln left speed on the table, and why",
    "cache": "whole-graph cache lookups: hits, and why a lookup missed or a graph was not stored",
}

PROGRAM_CHANNELS: tuple[str, ...] = ("graph", "guards", "bytecode", "aot", "ir", "output_code")
"""Channels whose lines are whole programs: left out of plain ``kiln``, which stays short."""

_FORMAT = "[%(name)s] %(message)s"
_handlers: dict[str, logging.Handler] = {}
_quieted: list[str] = []
_warned_unknown: set[str] = set()


def _logger_names(channel: str) -> list[str]:
    return [f"kiln.{pkg}.{channel}" for pkg in PACKAGES]


def _enable(name: str, level: int) -> None:
    logger = logging.getLogger(name)
    logger.setLevel(level)
    if name not in _handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(_FORMAT))
        logger.addHandler(handler)
        logger.propagate = False
        _handlers[name] = handler


def _disable_all() -> None:
    for name in _quieted:
        logging.getLogger(name).setLevel(logging.NOTSET)
    _quieted.clear()
    for name, handler in _handlers.items():
        logger = logging.getLogger(name)
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
        logger.propagate = True
    _handlers.clear()


def set_logs(spec: str | None) -> list[str]:
    """Apply a ``KILN_LOGS``-style spec (``"graph_breaks,recompiles"``); returns channels on.

    ``+kiln`` turns on every channel at debug level; ``+name`` one channel at debug level.
    An unknown name warns once, listing the valid ones; an empty spec turns everything off.
    """
    _disable_all()
    enabled: list[str] = []
    for raw in (spec or "").split(","):
        item = raw.strip()
        if not item:
            continue
        debug = item.startswith("+")
        name = item.lstrip("+")
        level = logging.DEBUG if debug else logging.INFO
        if name == "kiln":
            _enable("kiln", level)
            chosen = [c for c in CHANNELS if debug or c not in PROGRAM_CHANNELS]
            for channel in CHANNELS:
                for logger_name in _logger_names(channel):
                    if channel in chosen:
                        _enable(logger_name, level)
                    elif logger_name not in _handlers:  # quiet unless named on its own
                        logging.getLogger(logger_name).setLevel(logging.WARNING)
                        _quieted.append(logger_name)
            enabled.extend(chosen)
        elif name in CHANNELS:
            for logger_name in _logger_names(name):
                _enable(logger_name, level)
            enabled.append(name)
        elif name not in _warned_unknown:
            _warned_unknown.add(name)
            valid = ", ".join([*CHANNELS, "+kiln"])
            warnings.warn(
                f"KILN_LOGS: unknown channel {name!r} ignored; valid channels: {valid}",
                stacklevel=2,
            )
    return enabled


def configure_from_env() -> list[str]:
    """Read ``KILN_LOGS`` from the environment (done once when ``kiln`` is imported)."""
    return set_logs(os.environ.get("KILN_LOGS"))
