"""The liveness thresholds are checked together (nodes.E001, nodes.E002): errors in production."""

from __future__ import annotations

from django.core import checks
from django.test import override_settings

from apps.nodes.checks import liveness_thresholds
from modelforge.checks import problem_of
from modelforge.config import INVALID_SETTING


def found(**values: int) -> list[tuple[str, str | None, str, str]]:
    with override_settings(PRODUCTION=True, **values):
        messages = liveness_thresholds()
    problems = [problem_of(m) for m in messages]
    return [(type(m).__name__, m.id, p.code, p.setting) for m, p in zip(messages, problems, strict=True) if p]


def test_the_defaults_pass():
    assert found() == []


def test_a_stale_limit_under_three_intervals_would_flap_nodes_and_is_refused():
    assert found(HEARTBEAT_INTERVAL=10, NODE_STALE_AFTER=25) == [
        ("Error", "nodes.E001", INVALID_SETTING, "MODELFORGE_NODE_STALE_AFTER")
    ]


def test_offline_must_come_after_stale():
    assert found(NODE_STALE_AFTER=60, NODE_OFFLINE_AFTER=60) == [
        ("Error", "nodes.E002", INVALID_SETTING, "MODELFORGE_NODE_OFFLINE_AFTER")
    ]


def test_development_reports_them_as_warnings_among_the_configuration_checks():
    with override_settings(PRODUCTION=False, NODE_STALE_AFTER=60, NODE_OFFLINE_AFTER=60):
        messages = checks.run_checks(tags=["modelforge"])
    assert [(type(m).__name__, m.id) for m in messages] == [("Warning", "nodes.E002")]
