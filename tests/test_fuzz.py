"""The differential fuzzer, bounded: random small programs must give eager's answers through Kiln.

Derandomized, so CI sees the same programs on every run; the long run is the nox session
``fuzz`` (``nox -s fuzz -- --examples 20000``). A failure prints the program, its calls and a
shrunk, self-contained repro file's text.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings

sys.path.insert(0, str(Path(__file__).parent))

from fuzz.harness import run_program  # noqa: E402
from fuzz.programs import Program, programs  # noqa: E402
from fuzz.triage import repro_text, shrink  # noqa: E402

# About two minutes of CPU time on one core (the default backend compiles C++ for a third of them).
EXAMPLES = 300


def _check(program: Program) -> None:
    outcome = run_program(program.source, program.calls, program.backend, program.grad)
    if outcome.finding is not None and outcome.kind is not None:
        source, calls = shrink(
            program.source, program.calls, program.backend, program.grad, outcome.kind
        )
        text = repro_text(source, calls, program.backend, program.grad, outcome.finding)
        pytest.fail(f"{outcome.finding}\n\nrepro:\n{text}", pytrace=False)


@pytest.mark.slow
@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
@given(programs())
def test_random_programs_agree_with_eager(program: Program) -> None:
    _check(program)
