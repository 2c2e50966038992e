"""The gateway's bench times are checked together (gateway.E001)."""

from __future__ import annotations

from django.test import override_settings

from apps.clusters.checks import bench_times
from modelforge.checks import problem_of
from modelforge.config import INVALID_SETTING


def test_a_bench_cap_shorter_than_the_base_is_refused():
    with override_settings(PRODUCTION=True, LB_BASE_BENCH_S=60, LB_MAX_BENCH_S=30):
        [message] = bench_times()
    problem = problem_of(message)
    assert message.id == "gateway.E001" and problem is not None
    assert (problem.code, problem.setting) == (INVALID_SETTING, "MODELFORGE_LB_MAX_BENCH_S")
    with override_settings(LB_BASE_BENCH_S=60, LB_MAX_BENCH_S=60):
        assert bench_times() == []
