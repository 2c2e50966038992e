"""Heartbeats that arrive together are written together: over real HTTP to the gunicorn web process, on the
real database. The test holds node rows locked so that the web process's batches in flight wait on them
and the heartbeats sent meanwhile queue up behind; a statement-level trigger counts the UPDATE statements
the node table receives (a sequence, so a statement that fails is counted too). Each caller is answered
only after its own row is committed, with its own node; a batch that fails answers each of its callers
with a named error."""

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
from apps.nodes.fastpath import BATCHES_IN_FLIGHT
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


def wait_for_blocked(watcher: psycopg.Connection[Any], count: int) -> None:
    wait_for(lambda: len(blocked_batches(watcher)) == count)


def hold_every_writer(
    send: Callable[[str, dict[str, Any] | None], Future[httpx.Response]],
    holder: psycopg.Connection[Any],
    watcher: psycopg.Connection[Any],
    blockers: list[tuple[Node, str]],
) -> list[Future[httpx.Response]]:
    """Each of the process's batches in flight waits on a row the holder has locked: one heartbeat each,
    sent one after the other, so that each is a batch of its own."""
    holder.execute("BEGIN")
    holder.execute(
        f"SELECT 1 FROM {NODE_TABLE} WHERE id = ANY(%s) FOR UPDATE", [[node.pk for node, _ in blockers]]
    )
    first = []
    for count, (_, credential) in enumerate(blockers, start=1):
        first.append(send(credential, None))
        wait_for_blocked(watcher, count)
    return first


def test_heartbeats_sent_together_are_written_in_fewer_statements_each_answered_with_its_own_node(
    send, statements
):
    blockers = [make_node(name=f"blocker-{i}") for i in range(BATCHES_IN_FLIGHT)]
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
        first = hold_every_writer(send, holder, watcher, blockers)
        # Every one of these arrives while the batches in flight wait; the first blocker is sent again too
        # (a credential in a batch being written waits for a later one).
        reports = {credential: heartbeat_report(gpus=1 + i % 3) for i, (_, credential) in enumerate(nodes)}
        answers = [send(credential, report) for credential, report in reports.items()]
        again = send(blockers[0][1], heartbeat_report(gpus=4))
        time.sleep(1.0)
        waiting = [*first, *answers, again]
        assert not any(f.done() for f in waiting)  # nothing is answered before its commit
        holder.execute("COMMIT")
    for (node, _), answer in zip(blockers + nodes, first + answers, strict=True):
        response = answer.result()
        assert response.status_code == 200, response.text
        assert response.json()["node_id"] == str(node.pk)
        assert response.json()["liveness"] == "online"
    assert again.result().status_code == 200
    # The batches in flight, then the 12 together (and the repeat, with them or after them).
    assert statements() - before <= BATCHES_IN_FLIGHT + 2
    for node, credential in nodes:
        node.refresh_from_db()
        assert node.liveness == "online" and node.last_heartbeat_at is not None
        gpus = reports[credential]["gpus"]
        assert list(GPU.objects.filter(node=node).order_by("index").values_list("index", flat=True)) == [
            g["index"] for g in gpus
        ]
    assert GPU.objects.filter(node=blockers[0][0]).count() == 4  # the repeat was written after the first
    events = NodeEvent.objects.filter(kind="liveness", detail="heartbeat")
    assert sorted(events.values_list("node_id", "from_liveness", "to_liveness")) == sorted(
        [(stale.pk, "stale", "online"), (offline.pk, "offline", "online")]
        + [(node.pk, "pending", "online") for node, _ in blockers + nodes[2:]]
    )
    assert not Alert.objects.filter(node_alerts(stale, offline), cleared_at__isnull=True).exists()


def node_alerts(*nodes: Node) -> Any:
    from django.db.models import Q

    query = Q()
    for node in nodes:
        query |= Q(dedup_key__endswith=f":node:{node.pk}")
    return query


def test_a_batch_that_fails_answers_each_caller_with_a_named_error_and_writes_nothing(send, statements):
    blockers = [make_node(name=f"blocker-{i}") for i in range(BATCHES_IN_FLIGHT)]
    nodes = [make_node(name=f"n-{i}") for i in range(5)]
    everyone = blockers + nodes
    with database_session() as holder, database_session() as watcher:
        # Every node's row is held: whichever batch the heartbeats land in, it waits.
        first: list[Future[httpx.Response]] = []
        holder.execute("BEGIN")
        holder.execute(
            f"SELECT 1 FROM {NODE_TABLE} WHERE id = ANY(%s) FOR UPDATE", [[node.pk for node, _ in everyone]]
        )
        for count, (_, credential) in enumerate(blockers, start=1):
            first.append(send(credential, None))
            wait_for_blocked(watcher, count)
        answers = [send(credential, None) for _, credential in nodes] + [send(blockers[0][1], None)]
        time.sleep(1.0)
        # The database ends each waiting batch's session (as a restart would): every batch, and the retry
        # each makes on a fresh connection, until every caller has its answer.
        waiting = first + answers
        while not all(f.done() for f in waiting):
            for pid in blocked_batches(watcher):
                watcher.execute("SELECT pg_terminate_backend(%s)", [pid])
            time.sleep(0.05)
        holder.execute("COMMIT")
    for response in (f.result() for f in waiting):
        assert response.status_code == 503, response.text
        body = response.json()
        assert body["code"] == codes.HEARTBEAT_NOT_RECORDED
        assert set(body) == {"code", "message", "correlation_id"}
        assert response.headers["Retry-After"] == "1"
    for node, _ in everyone:
        node.refresh_from_db()
        assert node.last_heartbeat_at is None and node.liveness == "pending"  # nothing answered was written
    # Nothing is lost for good: the next heartbeats are written and answered.
    later = [send(credential, None) for _, credential in everyone]
    assert [f.result().status_code for f in later] == [200] * len(everyone)
    assert Node.objects.filter(liveness="online").count() == len(everyone)


def test_a_heartbeat_the_database_refuses_fails_alone_and_the_rest_of_its_batch_is_written(send, statements):
    blockers = [make_node(name=f"blocker-{i}") for i in range(BATCHES_IN_FLIGHT)]
    nodes = [make_node(name=f"n-{i}") for i in range(4)]
    hot = heartbeat_report(gpus=1)
    hot["gpus"][0]["temperature_c"] = 120  # valid at the boundary; a constraint of this test refuses it
    with connection.cursor() as cursor:
        cursor.execute(
            f"ALTER TABLE {GPU._meta.db_table} ADD CONSTRAINT hb_cool CHECK (temperature_c < 100) NOT VALID"
        )
    try:
        with database_session() as holder, database_session() as watcher:
            first = hold_every_writer(send, holder, watcher, blockers)
            answers = [send(credential, hot if i == 2 else None) for i, (_, credential) in enumerate(nodes)]
            time.sleep(1.0)
            before = statements()
            holder.execute("COMMIT")
            assert [f.result().status_code for f in first] == [200] * BATCHES_IN_FLIGHT
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
        **{node.name: ("online", True) for node, _ in blockers},
        "n-0": ("online", True),
        "n-1": ("online", True),
        "n-2": ("pending", False),
        "n-3": ("online", True),
    }
