"""Heartbeats that arrive together are written together: over real HTTP to the gunicorn web process, on the
real database. One node's row is held locked by the test so that the heartbeats sent meanwhile queue up
behind the blocked batch; a statement-level trigger counts the UPDATE statements the node table receives
(a sequence, so a statement that fails is counted too). Each caller is answered only after its own row is
committed, with its own node; a batch that fails answers each of its callers with a named error."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import psycopg
import pytest
from django.db import connection

from apps.alerts.models import Alert
from apps.nodes import codes
from apps.nodes.models import GPU, Node, NodeEvent
from apps.nodes.tests.factories import heartbeat_report, make_node

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.stack]

PATH = "/api/v1/agent/heartbeat"
NODE_TABLE = Node._meta.db_table


def database_session() -> psycopg.Connection[Any]:
    db = connection.settings_dict
    return psycopg.connect(
        host=db["HOST"] or "127.0.0.1",
        port=int(db["PORT"] or 5432),
        user=db["USER"] or None,
        password=db["PASSWORD"] or None,
        dbname=db["NAME"],
        autocommit=True,
    )


@pytest.fixture
def statements() -> Iterator[Callable[[], int]]:
    """How many UPDATE statements the node table has received since the fixture began."""
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE SEQUENCE hb_statements; "
            "CREATE FUNCTION hb_count() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN PERFORM nextval('hb_statements'); RETURN NULL; END $$; "
            f"CREATE TRIGGER hb_count BEFORE UPDATE ON {NODE_TABLE} "
            "FOR EACH STATEMENT EXECUTE FUNCTION hb_count()"
        )

    def count() -> int:
        with database_session() as conn:
            row = conn.execute("SELECT is_called, last_value FROM hb_statements").fetchone()
        assert row is not None
        return int(row[1]) if row[0] else 0

    try:
        yield count
    finally:
        with connection.cursor() as cursor:
            cursor.execute(
                f"DROP TRIGGER hb_count ON {NODE_TABLE}; DROP FUNCTION hb_count(); "
                "DROP SEQUENCE hb_statements"
            )


@pytest.fixture
def send(live_web) -> Iterator[Callable[[str, dict[str, Any] | None], Future[httpx.Response]]]:
    """Sends a heartbeat from a thread of its own; the future is its answer."""
    with httpx.Client(base_url=live_web.url, timeout=30) as client, ThreadPoolExecutor(32) as pool:

        def post(credential: str, report: dict[str, Any] | None = None) -> Future[httpx.Response]:
            headers = {"Content-Type": "application/json", "Authorization": f"Bearer {credential}"}
            body = json.dumps(report or heartbeat_report()).encode()
            return pool.submit(client.post, PATH, content=body, headers=headers)

        yield post


def blocked_batches(db: psycopg.Connection[Any]) -> list[int]:
    """Backends whose heartbeat batch is waiting on a row lock."""
    rows = db.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' "
        "AND query LIKE '%%jsonb_to_recordset%%'"
    ).fetchall()
    return [pid for (pid,) in rows]


def wait_for(check: Callable[[], Any], seconds: float = 15) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("not within the time")


def terminate_the_blocked_batch(watcher: psycopg.Connection[Any]) -> None:
    pids = set(wait_for(lambda: blocked_batches(watcher)))
    for pid in pids:
        watcher.execute("SELECT pg_terminate_backend(%s)", [pid])
    wait_for(lambda: not pids & set(blocked_batches(watcher)))


def test_heartbeats_sent_together_are_written_in_fewer_statements_each_answered_with_its_own_node(
    send, statements
):
    blocker, blocker_credential = make_node(name="blocker")
    nodes = [make_node(name=f"n-{i}") for i in range(12)]
    # Recovery rides in the batch too: a stale and an offline node come back online with their events,
    # and their liveness alerts are cleared.
    stale, offline = nodes[0][0], nodes[1][0]
    Node.objects.filter(pk=stale.pk).update(liveness="stale")
    Node.objects.filter(pk=offline.pk).update(liveness="offline")
    for node, code in ((stale, codes.ALERT_NODE_STALE), (offline, codes.ALERT_NODE_OFFLINE)):
        Alert.objects.create(
            code=code,
            severity="warning",
            subject_type="node",
            subject_id=str(node.pk),
            subject_name=node.name,
            dedup_key=f"{code}:node:{node.pk}",
            message=f"{node.name} went silent",
        )
    before = statements()
    with database_session() as holder, database_session() as watcher:
        holder.execute("BEGIN")
        holder.execute(f"SELECT 1 FROM {NODE_TABLE} WHERE id = %s FOR UPDATE", [blocker.pk])
        first = send(blocker_credential, None)
        wait_for(lambda: blocked_batches(watcher))
        # Every one of these arrives while the first batch waits; the node of the first is sent again too
        # (a credential already in a batch waits for the next one).
        reports = {credential: heartbeat_report(gpus=1 + i % 3) for i, (_, credential) in enumerate(nodes)}
        answers = [send(credential, report) for credential, report in reports.items()]
        again = send(blocker_credential, heartbeat_report(gpus=4))
        time.sleep(1.0)
        assert not first.done() and not any(a.done() for a in answers)  # nothing answered before its commit
        holder.execute("COMMIT")
    first_answer = first.result()
    assert first_answer.status_code == 200, first_answer.text
    assert first_answer.json()["node_id"] == str(blocker.pk)
    for (node, _), answer in zip(nodes, answers, strict=True):
        response = answer.result()
        assert response.status_code == 200, response.text
        assert response.json()["node_id"] == str(node.pk)
        assert response.json()["liveness"] == "online"
    assert again.result().status_code == 200
    # 14 heartbeats: the blocked one alone, then the 12 (and possibly the repeat) together.
    assert statements() - before <= 3
    for node, credential in nodes:
        node.refresh_from_db()
        assert node.liveness == "online" and node.last_heartbeat_at is not None
        gpus = reports[credential]["gpus"]
        assert list(GPU.objects.filter(node=node).order_by("index").values_list("index", flat=True)) == [
            g["index"] for g in gpus
        ]
    assert GPU.objects.filter(node=blocker).count() == 4  # the repeat was written after the first
    events = NodeEvent.objects.filter(kind="liveness", detail="heartbeat")
    assert sorted(events.values_list("node_id", "from_liveness", "to_liveness")) == sorted(
        [(stale.pk, "stale", "online"), (offline.pk, "offline", "online")]
        + [(node.pk, "pending", "online") for node in [blocker] + [n for n, _ in nodes[2:]]]
    )
    assert not Alert.objects.filter(node_alerts(stale, offline), cleared_at__isnull=True).exists()


def node_alerts(*nodes: Node) -> Any:
    from django.db.models import Q

    query = Q()
    for node in nodes:
        query |= Q(dedup_key__endswith=f":node:{node.pk}")
    return query


def test_a_batch_that_fails_answers_each_caller_with_a_named_error_and_writes_nothing(send, statements):
    blocker, blocker_credential = make_node(name="blocker")
    nodes = [make_node(name=f"n-{i}") for i in range(5)]
    with database_session() as holder, database_session() as watcher:
        holder.execute("BEGIN")
        holder.execute(f"SELECT 1 FROM {NODE_TABLE} WHERE id = %s FOR UPDATE", [blocker.pk])
        first = send(blocker_credential, None)
        wait_for(lambda: blocked_batches(watcher))
        answers = [send(credential, None) for _, credential in nodes] + [send(blocker_credential, None)]
        time.sleep(1.0)
        # The database ends the batch's session (as a restart would), twice: the batch and its one retry
        # on a fresh connection. Then the next batch, which holds the other six, the same way.
        for _ in range(4):
            terminate_the_blocked_batch(watcher)
        responses = [first.result()] + [a.result() for a in answers]
        holder.execute("COMMIT")
    for response in responses:
        assert response.status_code == 503, response.text
        body = response.json()
        assert body["code"] == codes.HEARTBEAT_NOT_RECORDED
        assert set(body) == {"code", "message", "correlation_id"}
        assert response.headers["Retry-After"] == "1"
    for node in [blocker] + [n for n, _ in nodes]:
        node.refresh_from_db()
        assert node.last_heartbeat_at is None and node.liveness == "pending"  # nothing answered was written
    # Nothing is lost for good: the next heartbeats are written and answered.
    later = [send(credential, None) for _, credential in [(blocker, blocker_credential), *nodes]]
    assert [f.result().status_code for f in later] == [200] * 6
    assert Node.objects.filter(liveness="online").count() == 6


def test_a_heartbeat_the_database_refuses_fails_alone_and_the_rest_of_its_batch_is_written(send, statements):
    blocker, blocker_credential = make_node(name="blocker")
    nodes = [make_node(name=f"n-{i}") for i in range(4)]
    hot = heartbeat_report(gpus=1)
    hot["gpus"][0]["temperature_c"] = 120  # valid at the boundary; a constraint of this test refuses it
    with connection.cursor() as cursor:
        cursor.execute(
            f"ALTER TABLE {GPU._meta.db_table} ADD CONSTRAINT hb_cool CHECK (temperature_c < 100) NOT VALID"
        )
    try:
        with database_session() as holder, database_session() as watcher:
            holder.execute("BEGIN")
            holder.execute(f"SELECT 1 FROM {NODE_TABLE} WHERE id = %s FOR UPDATE", [blocker.pk])
            first = send(blocker_credential, None)
            wait_for(lambda: blocked_batches(watcher))
            answers = [send(credential, hot if i == 2 else None) for i, (_, credential) in enumerate(nodes)]
            time.sleep(1.0)
            before = statements()
            holder.execute("COMMIT")
            assert first.result().status_code == 200
            responses = [a.result() for a in answers]
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {GPU._meta.db_table} DROP CONSTRAINT hb_cool")
    assert [r.status_code for r in responses] == [200, 200, 500, 200]
    assert responses[2].text == "Internal Server Error"
    # One statement for the four, which failed, then one each to find whose heartbeat it was.
    assert statements() - before == 5
    states = {n.name: (n.liveness, n.last_heartbeat_at is not None) for n in Node.objects.all()}
    assert states == {
        "blocker": ("online", True),
        "n-0": ("online", True),
        "n-1": ("online", True),
        "n-2": ("pending", False),
        "n-3": ("online", True),
    }
