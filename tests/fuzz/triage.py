"""Shrink a failing program and write it out as a self-contained repro file.

Hypothesis shrinks over its choice sequence, which for a program generator mostly shortens
variable chains; this shrinker works on the text instead: it drops whole statements of ``f``
(a line with its indented block) and calls, keeping each cut while the same kind of finding
remains. It is greedy and cheap (each try compiles the program once), which is what triage of
a long run needs.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from . import harness
from .harness import Call, run_program


def _statements(source: str) -> tuple[str, list[list[str]], str]:
    """Split ``source`` into (text before f's body, f's top-level statements, the return line)."""
    head, body = source.split("def f(x, y, s):\n", 1)
    lines = body.rstrip("\n").split("\n")
    *stmts_lines, ret = lines
    stmts: list[list[str]] = []
    for line in stmts_lines:
        if line.startswith("     ") or line.startswith("    else:"):
            stmts[-1].append(line)
        else:
            stmts.append([line])
    return head + "def f(x, y, s):\n", stmts, ret


def _join(head: str, stmts: list[list[str]], ret: str) -> str:
    return head + "".join(line + "\n" for stmt in stmts for line in stmt) + ret + "\n"


def shrink(
    source: str, calls: tuple[Call, ...], backend: str, grad: bool, kind: str
) -> tuple[str, tuple[Call, ...]]:
    """The smallest program and call list (greedily) that still gives a finding of ``kind``."""

    def fails(src: str, cs: tuple[Call, ...]) -> bool:
        try:
            out = run_program(src, cs, backend, grad)
        except Exception:
            return False
        return out.kind == kind

    head, stmts, ret = _statements(source)
    changed = True
    while changed:
        changed = False
        for i in reversed(range(len(stmts))):
            trial = stmts[:i] + stmts[i + 1 :]
            if fails(_join(head, trial, ret), calls):
                stmts, changed = trial, True
        for i in reversed(range(len(calls))):
            trial_calls = calls[:i] + calls[i + 1 :]
            if trial_calls and fails(_join(head, stmts, ret), trial_calls):
                calls, changed = trial_calls, True
    return _join(head, stmts, ret), calls


def repro_text(source: str, calls: tuple[Call, ...], backend: str, grad: bool, finding: str) -> str:
    """A file that runs on its own: the harness's text, the program, its calls and a main."""
    harness_text = inspect.getsource(harness)
    harness_text = re.sub(r'^"""(.|\n)*?"""\n', "", harness_text, count=1)
    call_list = ",\n    ".join(repr(c) for c in calls)
    lines = [f"backend={backend!r} grad={grad}", *finding.splitlines()[:12]]
    comment = "\n".join("# " + line for line in lines)
    return (
        f'"""Kiln differential fuzzer repro: run with python; it prints the difference."""\n'
        f"{comment}\n{harness_text}\n\n"
        f"SOURCE = {source!r}\n\n"
        f"CALLS = [\n    {call_list},\n]\n\n"
        f'if __name__ == "__main__":\n'
        f"    print(SOURCE)\n"
        f"    print(run_program(SOURCE, CALLS, {backend!r}, {grad!r}))\n"
    )


def signature(finding: str) -> str:
    """A key grouping findings of one cause: the kind and the message with numbers blotted out."""
    first = finding.splitlines()[0]
    first = re.sub(r"call \d+", "call N", first)
    first = re.sub(r"\[\d+\]", "[i]", first)
    first = re.sub(r"\d+(\.\d+)?", "#", first)
    return first[:160]


def write_repro(
    out_dir: Path,
    index: int,
    source: str,
    calls: tuple[Call, ...],
    backend: str,
    grad: bool,
    finding: str,
) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"repro_{index:03d}.py"
    path.write_text(repro_text(source, calls, backend, grad, finding))
    return path


__all__ = ["repro_text", "shrink", "signature", "write_repro"]
