"""Config switches act on the next call."""

from __future__ import annotations

from kiln import guards
from kiln.guards import stamps


def test_setting_any_field_moves_the_module_stamp():
    before = stamps.current()
    guards.config.trust_module_stamps = False
    assert stamps.current() != before
    assert guards.config.recompile_limit == 8
    assert isinstance(guards.config, guards.GuardsConfig)
