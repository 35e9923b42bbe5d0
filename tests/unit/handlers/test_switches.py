"""handlers/switches.py: the diagnostics switches read from the environment."""

from __future__ import annotations

import pytest


def test_diagnostics_switch_must_be_a_number(monkeypatch):
    from handlers.switches import Diagnostics

    with pytest.raises(ValueError, match="KIT_PROFILE_REQUESTS must be a whole number of requests, got 'ten'"):
        Diagnostics.from_environment({"KIT_PROFILE_REQUESTS": "ten"})
