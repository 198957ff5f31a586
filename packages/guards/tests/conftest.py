"""Every kiln.guards test starts and ends with empty caches and default config."""

from __future__ import annotations

import pytest

from kiln import guards


@pytest.fixture(autouse=True)
def _fresh_guards():
    guards.reset()
    saved = guards.config.recompile_limit, guards.config.accumulated_recompile_limit
    yield
    guards.reset()
    guards.config.recompile_limit, guards.config.accumulated_recompile_limit = saved
    guards.config.fail_on_recompile_limit = False
    guards.config.skip_guards = False
    guards.config.trust_module_stamps = True
