"""The nodes' configuration rules (nodes.E001-E004): errors in production, warnings in development."""

from __future__ import annotations

from django.core import checks
from django.test import override_settings

from apps.nodes.checks import listening, liveness_thresholds
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


def listening_found(**values: object) -> list[tuple[str | None, str | None]]:
    with override_settings(**values):
        messages = listening()
    problems = [problem_of(m) for m in messages]
    return [(m.id, p.setting if p else None) for m, p in zip(messages, problems, strict=True)]


def test_the_listening_stamps_stay_on_in_production_only():
    assert listening_found(PRODUCTION=True, LISTENING_STAMPS=False) == [
        ("nodes.E003", "MODELFORGE_LISTENING_STAMPS")
    ]
    assert listening_found(PRODUCTION=False, LISTENING_STAMPS=False) == []


def test_a_listening_gap_of_two_sweeps_or_less_would_restart_every_grace_period():
    assert listening_found(LISTENING_GAP=10, LIVENESS_SWEEP_INTERVAL=5) == [
        ("nodes.E004", "MODELFORGE_LISTENING_GAP")
    ]
    assert listening_found(LISTENING_GAP=11, LIVENESS_SWEEP_INTERVAL=5) == []
