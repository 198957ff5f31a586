"""The root of every Kiln exception, and capture's own errors.

Every package roots its hierarchy in :class:`KilnError` so a user can catch
one type. Messages say what went wrong, where in the user's code, and what
to do about it.
"""

from __future__ import annotations

import dataclasses

__all__ = ["KilnError", "CaptureError", "Unsupported", "UserFrame"]


class KilnError(Exception):
    """Base class of every error Kiln raises on purpose."""


class CaptureError(KilnError):
    """An internal failure while capturing a frame (a Kiln bug, not user error)."""


@dataclasses.dataclass(frozen=True)
class UserFrame:
    """A place in the user's source: file, line, function and the line's text."""

    filename: str
    lineno: int
    name: str
    source: str = ""

    def __str__(self) -> str:
        where = f"{self.filename}:{self.lineno} in {self.name}"
        return f"{where}\n    {self.source.strip()}" if self.source else where


class Unsupported(KilnError):
    """Capture met something it cannot put in a graph.

    Without ``fullgraph=True`` this becomes a graph break; with it, the user sees
    this error: the kind of break, why, a hint, and their own source line.
    """

    def __init__(
        self,
        kind: str,
        explanation: str,
        hint: str = "",
        frame: UserFrame | None = None,
    ) -> None:
        self.kind = kind
        self.explanation = explanation
        self.hint = hint
        self.frame = frame
        super().__init__(self._message())

    def _message(self) -> str:
        lines = [f"{self.kind}: {self.explanation}"]
        if self.hint:
            lines.append(f"hint: {self.hint}")
        if self.frame is not None:
            lines.append(f"at {self.frame}")
        return "\n".join(lines)

    def with_frame(self, frame: UserFrame) -> Unsupported:
        """The same error, located at ``frame`` (the innermost user line that failed)."""
        return Unsupported(self.kind, self.explanation, self.hint, frame)


class EagerRaises(KilnError):
    """The user's program raises here when run eagerly (a shape mismatch a torch op checks):
    no graph break to log; the frontend runs the frame eagerly, which raises the user's error."""
