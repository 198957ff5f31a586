"""pytest plugin: run loopir's own op and fusion tests through the Triton backend.

loopir's tests compile with its reference backend; this plugin swaps in the
Triton backend (under the interpreter) so the whole lowering corpus checks our
kernels against eager. Takes about a minute on two cores, so it is not part of
this package's suite::

    PYTHONPATH=packages/codegen_triton/tests .venv/bin/python -m pytest \\
        -p loopir_corpus_plugin packages/loopir/tests/test_lowering_*.py \\
        packages/loopir/tests/test_decompositions.py packages/loopir/tests/test_pipeline.py
"""

import os

os.environ["TRITON_INTERPRET"] = "1"

import kiln.loopir  # noqa: E402
from kiln.codegen_triton import TritonBackend  # noqa: E402


def pytest_configure(config):
    kiln.loopir.ReferenceBackend = TritonBackend  # loopir_testing imports it from here
    kiln.loopir.backend.register_backend("cpu", TritonBackend())
    config.addinivalue_line("filterwarnings", "ignore::RuntimeWarning:triton.runtime.interpreter")
