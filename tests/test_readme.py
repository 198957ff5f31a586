"""The README's usage example runs as written."""

import re
from pathlib import Path

import kiln


def test_usage_example_runs():
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = re.search(r"```python\n(.*?)```", text, re.S)
    assert block is not None
    kiln.reset()
    exec(compile(block.group(1), "README.md", "exec"), {})
    assert kiln.stats().frames_captured == 1
