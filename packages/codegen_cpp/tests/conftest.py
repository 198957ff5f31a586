"""Shared fixtures: one private build cache for the whole test session."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def session_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Builds of this session go to a fresh cache, shared by every test in it."""
    folder = tmp_path_factory.mktemp("kiln_cache")
    old = os.environ.get("KILN_CACHE_DIR")
    os.environ["KILN_CACHE_DIR"] = str(folder)
    yield folder
    if old is None:
        os.environ.pop("KILN_CACHE_DIR", None)
    else:
        os.environ["KILN_CACHE_DIR"] = old


# Helpers shared by test modules live next to them (fusion_programs.py).
sys.path.insert(0, str(Path(__file__).parent))
