"""No tracked file speaks of how Kiln was developed (STYLE.md, convention 11).

Code, tests, docs, changelogs and benchmark files describe the product as it is; history lives
in CHANGELOGs and git. So no file names development rounds or numbered sessions, refers to
an issue number as the reason for code, or keeps a dated log. The patterns match only those
forms: a nox or pytest *session* (``nox -s``, ``scope="session"``, "this session's Python")
is a real concept and passes, and so do dates in measured results' metadata.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()  # its cases quote what it finds

PATTERNS = {
    "a numbered session": r"\bsessions? \d+",
    "a session relative to another": r"\b(next|previous|earlier|later|last|same|another) session\b",
    "a session of a date": r"\bsessions? of 20\d\d",
    # a round's short name (s12, s13, ...) in prose, a file name or a folder, not a variable
    "a round named by number": (
        r"`s1\d`|\(s1\d\)|-s1\d\b|\bs1\d-[a-z]"
        r"|\bs1\d (shards?|runs?|tables?|results|numbers|charts?|calls?)\b"
    ),
    "a numbered round": r"\brounds? \d+",
    "an issue number": r"\bissues? #?\d+",
    "a bare issue reference": r"(?<![\w&/])#\d+\b",
    "an agent": r"\b(sub-?)?agents?\b",
    "a dated heading": r"^#+ .*\b20\d\d-\d\d-\d\d",
    "a dated run": r"\b(taken|measured|run|ran) (on )?20\d\d-\d\d-\d\d",
}
_COMPILED = {name: re.compile(p, re.IGNORECASE) for name, p in PATTERNS.items()}


def _tracked_texts() -> list[tuple[str, str]]:
    try:
        listing = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, text=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    texts = []
    for name in filter(None, listing.split("\0")):
        path = ROOT / name
        if name == SELF:
            continue
        if not path.is_file():  # deleted in the working tree, not yet in the index
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue
        try:
            texts.append((name, data.decode()))
        except UnicodeDecodeError:
            continue
    return texts


def mentions(text: str) -> list[tuple[int, str, str]]:
    """(line number, what, line) for each line that speaks of development history."""
    return [
        (n, what, line.strip())
        for n, line in enumerate(text.splitlines(), 1)
        for what, pattern in _COMPILED.items()
        if pattern.search(line)
    ]


def test_no_tracked_file_mentions_development_history() -> None:
    found = [
        f"{name}:{n}: {what}: {line[:120]}"
        for name, text in _tracked_texts()
        for n, what, line in mentions(text)
    ]
    assert not found, "rewrite as a statement about the code as it is:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "line",
    [
        "### Session 14: float32 training",
        "merged with the s13 shards",
        "docs/results/s13-fp32-inference/",
        "performance-gpu-fp32-training-s14.png",
        "fixed in round 3",
        "the next session measures it",
        "as issue 27 asks",
        "the three settings of #9",
        "written by a helper agent",
        "## Quick set, 2026-11-23 afternoon",
        "Taken 2026-11-24 10:10 UTC on the machine",
    ],
)
def test_history_is_found(line: str) -> None:
    assert mentions(line)


@pytest.mark.parametrize(
    "line",
    [
        "nox -s bench -- --device cpu",
        '@pytest.fixture(scope="session", autouse=True)',
        """The shared environment for this session's Python""",
        "Builds of this session go to a fresh cache",
        "def tests(session: nox.Session) -> None:",
        "round(t, 4) for c, t in timings.items()",
        "s1 = s0 + 1; s10 = s1 * 2",
        "date 2026-11-24 10:26 UTC, kiln 0.1.0",
        "color: #1f77b4",
    ],
)
def test_product_text_passes(line: str) -> None:
    assert not mentions(line)
