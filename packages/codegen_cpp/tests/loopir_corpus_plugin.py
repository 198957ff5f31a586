"""A pytest plugin that runs loopir's own test corpus through the C++ backend.

loopir's tests compile with its reference backend through ``loopir_testing``;
this swaps in :class:`kiln.codegen_cpp.CppBackend`, so every lowering and fusion
they check against eager is checked again as generated C++::

    PYTHONPATH=packages/codegen_cpp/tests:packages/loopir/tests \\
        .venv/bin/python -m pytest -p loopir_corpus_plugin packages/loopir/tests -q
"""

from __future__ import annotations

import loopir_testing

from kiln.codegen_cpp import CppBackend

loopir_testing.ReferenceBackend = CppBackend  # type: ignore[misc]
