"""Hypothesis profiles for the fuzz suite: ``ci`` (bounded, deterministic; the default) and ``fuzz``
(many more examples, random seeds: ``make fuzz``). Pick one with ``AGL_FUZZ_PROFILE``."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large]
settings.register_profile(
    "ci", max_examples=40, deadline=None, derandomize=True, suppress_health_check=_SLOW_OK
)
settings.register_profile("fuzz", max_examples=1500, deadline=None, suppress_health_check=_SLOW_OK)
settings.load_profile(os.environ.get("AGL_FUZZ_PROFILE", "ci"))
