"""Errors of the C++ backend, rooted in :class:`kiln.capture.errors.KilnError`.

A failed C++ build is not the user's fault, but they can act on it: the message
names the generated file (kept on disk) and quotes the compiler, so a bug report
or a missing toolchain is one copy-paste away. The frontend turns it into an
eager fallback with one warning, or raises it under ``fullgraph=True``.
"""

from __future__ import annotations

from pathlib import Path

from kiln.capture.errors import KilnError

__all__ = ["CodegenCppError", "CompilerNotFound", "CppBuildError", "KernelIndexError"]

_MAX_MESSAGE_LINES = 40


class CodegenCppError(KilnError):
    """Base class of the errors :mod:`kiln.codegen_cpp` raises."""


class CompilerNotFound(CodegenCppError):
    """No C++ compiler on PATH (or the one ``CXX`` names does not run)."""


class CppBuildError(CodegenCppError):
    """The system C++ compiler rejected a generated source file."""

    def __init__(self, source_path: Path, command: list[str], compiler_output: str) -> None:
        self.source_path = source_path
        self.command = command
        self.compiler_output = compiler_output
        lines = compiler_output.strip().splitlines()
        shown = lines[:_MAX_MESSAGE_LINES]
        if len(lines) > len(shown):
            shown.append(f"... ({len(lines) - len(shown)} more lines)")
        message = "\n".join(
            [
                f"C++ compilation failed for the generated file {source_path}",
                "compiler said:",
                *("    " + line for line in shown),
                f"command: {' '.join(command)}",
                "hint: this is a Kiln bug; please report it with the file above. "
                "Set CXX to choose another compiler.",
            ]
        )
        super().__init__(message)


class KernelIndexError(CodegenCppError, IndexError):
    """A compiled kernel met an indirect index outside its dimension (as eager would raise)."""

    def __init__(self, kernel: str, value: int, size: int) -> None:
        self.value, self.size = value, size
        super().__init__(
            f"index {value} is out of bounds for dimension with size {size} "
            f"(in compiled CPU kernel {kernel}); check the indices passed to indexing ops"
        )
