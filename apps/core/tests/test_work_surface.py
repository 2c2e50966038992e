"""The stuck-work watchdog's operator surface: the waiting rows, retry and mark failed, in the API
(``/api/v1/system/work``), the dashboard's Work page, the overview card and the admin; refusals by code
(``WORK_KIND_UNKNOWN``, ``WORK_NOT_WAITING``), never a 500."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.contrib.messages import get_messages
from django.utils import timezone
from kombu.exceptions import OperationalError

from apps.alerts.models import Alert
from apps.artifacts.models import Artifact, ArtifactEvent, Replica
from apps.backups.models import Backup, BackupEvent, Restore
from apps.core import work
from apps.nodes.models import Node
from apps.nodes.tests.factories import make_node
from apps.servers.models import ModelServer, ServerEvent
from modelforge import dispatch
from tests.fixtures import ARTIFACTS, log_in

pytestmark = pytest.mark.django_db

HOUR = 3600


def ago(seconds: float) -> datetime:
    return timezone.now() - timedelta(seconds=seconds)


# --- rows that wait, made directly in the database ----------------------------------------------------


def queued_backup(age: float) -> Backup:
    return Backup.objects.create(state="queued", requested_at=ago(age), requested_by="ops")


def queued_restore(age: float) -> Restore:
    source = Backup.objects.create(state="verified", requested_at=ago(2 * HOUR), verified_at=ago(HOUR))
    return Restore.objects.create(backup=source, requested_by="ops", reason="drill", requested_at=ago(age))


def requested_artifact(age: float, name: str = "bge-small") -> Artifact:
    return Artifact.objects.create(
        name=name, source_kind="http", locator="https://example.org/w", created_at=ago(age)
    )


def stopping_server(age: float, node: Node | None = None) -> ModelServer:
    node = node or make_node("node-1", accelerator="cpu")[0]
    server = ModelServer.objects.create(
        name="echo", profile="test-echo", model="m", node=node, state="stopping", created_at=ago(age + 60)
    )
    ServerEvent.objects.create(server=server, from_state="running", to_state="stopping", at=ago(age))
    return server


def requested_replica(age: float) -> Replica:
    artifact = Artifact.objects.create(
        name="llama", source_kind="http", locator="https://example.org/l", state="ready"
    )
    node = make_node("node-2", accelerator="cpu")[0]
    return Replica.objects.create(
        artifact=artifact, node=node, name="llama", requested_at=ago(age), updated_at=ago(age)
    )


@pytest.fixture
def sent(monkeypatch) -> list[tuple[str, tuple[Any, ...]]]:
    """The tasks the surface sends, recorded instead of published (no worker consumes this test's queue)."""
    from apps.artifacts import tasks as artifact_tasks
    from apps.backups import tasks as backup_tasks
    from apps.servers import tasks as server_tasks

    calls: list[tuple[str, tuple[Any, ...]]] = []
    for task in (
        backup_tasks.take_backup,
        backup_tasks.verify_backup,
        backup_tasks.run_restore,
        server_tasks.start_server,
        server_tasks.stop_server,
        artifact_tasks.acquire,
        artifact_tasks.replicate,
    ):

        def record(args: Any, *, _name: str = task.name, **kwargs: Any) -> None:
            calls.append((_name, tuple(args)))

        monkeypatch.setattr(task, "apply_async", record)
    return calls


@pytest.fixture
def broker_away(monkeypatch) -> None:
    """Every publication fails the way kombu fails when Redis refuses the connection."""
    from apps.backups import tasks as backup_tasks

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(backup_tasks.take_backup, "apply_async", refuse)
    monkeypatch.setattr(dispatch, "_outage", dispatch._Outage())  # this test's outage starts now


@pytest.fixture
def staff(client):
    client.force_login(User.objects.create_user("ops", is_staff=True))
    return client


@pytest.fixture
def superuser(client):
    client.force_login(User.objects.create_superuser("root-ops", email="", password="x-long-password-1"))
    return client


def assert_envelope(response, status: int, code: str) -> str:
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"code", "message", "correlation_id"}
    assert body["code"] == code
    return str(body["message"])


def rows_of(response) -> list[dict[str, Any]]:
    assert response.status_code == 200, response.content
    return list(response.json()["results"])


# --- API: the list ------------------------------------------------------------------------------------


def test_the_list_shows_every_waiting_row_oldest_first_with_its_bound_and_whether_it_is_stuck(
    operator_client, settings
):
    settings.WORK_STUCK_AFTER = 600
    backup = queued_backup(HOUR)
    artifact = requested_artifact(120)
    server = stopping_server(1800)
    restore = queued_restore(30)
    Backup.objects.create(
        state="verified", requested_at=ago(3 * HOUR), verified_at=ago(3 * HOUR)
    )  # not waiting

    rows = rows_of(operator_client.get("/api/v1/system/work"))

    assert [(r["kind"], r["id"]) for r in rows] == [
        ("backup", str(backup.pk)),
        ("server", str(server.pk)),
        ("artifact", str(artifact.pk)),
        ("restore", str(restore.pk)),
    ]
    first = rows[0]
    assert set(first) == {
        "kind", "id", "name", "state", "waits_on", "since", "age_seconds", "stuck_after_seconds", "stuck",
    }  # fmt: skip
    assert (first["name"], first["state"], first["waits_on"]) == (
        f"backup #{backup.pk}",
        "queued",
        "a worker to take it",
    )
    assert 3590 < first["age_seconds"] < 3700 and first["stuck_after_seconds"] == 600
    assert [r["stuck"] for r in rows] == [True, True, False, False]
    assert rows[1]["waits_on"] == "its agent to stop it" and rows[1]["name"] == "echo"


def test_the_list_filters_by_kind_and_by_stuck(operator_client):
    backup = queued_backup(HOUR)
    queued_restore(30)
    requested_artifact(HOUR, name="old")

    stuck = rows_of(operator_client.get("/api/v1/system/work?stuck=true"))
    assert {r["kind"] for r in stuck} == {"backup", "artifact"}
    fresh = rows_of(operator_client.get("/api/v1/system/work?stuck=false"))
    assert [r["kind"] for r in fresh] == ["restore"]
    backups = rows_of(operator_client.get("/api/v1/system/work?kind=backup"))
    assert [r["id"] for r in backups] == [str(backup.pk)]
    assert rows_of(operator_client.get("/api/v1/system/work?kind=restore&stuck=true")) == []


def test_a_filter_it_cannot_read_is_a_validation_error_not_a_guess(operator_client):
    queued_backup(HOUR)
    message = assert_envelope(operator_client.get("/api/v1/system/work?stuck=maybe"), 400, "VALIDATION_ERROR")
    assert "stuck: Must be a valid boolean" in message
    message = assert_envelope(operator_client.get("/api/v1/system/work?kind=jobs"), 400, "VALIDATION_ERROR")
    assert 'kind: "jobs" is not a valid choice' in message
    # Empty is not "any": the schema lists the kinds, and the answer keeps to it.
    assert_envelope(operator_client.get("/api/v1/system/work?kind="), 400, "VALIDATION_ERROR")
    assert_envelope(operator_client.get("/api/v1/system/work?stuck="), 400, "VALIDATION_ERROR")


def test_the_work_api_is_for_the_operator_only(anonymous_client):
    queued_backup(HOUR)
    assert_envelope(anonymous_client.get("/api/v1/system/work"), 401, "NOT_AUTHENTICATED")
    backup = Backup.objects.get()
    assert_envelope(
        anonymous_client.post(f"/api/v1/system/work/backup/{backup.pk}/fail"), 401, "NOT_AUTHENTICATED"
    )
    assert Backup.objects.get().state == "queued"


def test_the_schema_describes_the_work_operations(operator_client):
    schema = operator_client.get("/api/v1/schema/?format=json").json()
    paths = schema["paths"]
    assert "get" in paths["/api/v1/system/work"]
    assert "202" in paths["/api/v1/system/work/{kind}/{id}/retry"]["post"]["responses"]
    assert "200" in paths["/api/v1/system/work/{kind}/{id}/fail"]["post"]["responses"]


# --- API: retry ---------------------------------------------------------------------------------------


def test_retry_re_sends_the_rows_task_and_answers_202_with_the_row(operator_client, sent):
    backup = queued_backup(HOUR)
    response = operator_client.post(f"/api/v1/system/work/backup/{backup.pk}/retry")
    assert response.status_code == 202, response.content
    body = response.json()
    assert (body["kind"], body["id"], body["state"], body["stuck"]) == (
        "backup",
        str(backup.pk),
        "queued",
        True,
    )
    assert sent == [("backups.take_backup", (backup.pk,))]
    backup.refresh_from_db()
    assert backup.state == "queued"


def test_retry_answers_202_while_the_broker_is_away(operator_client, broker_away, caplog):
    # Guards finding 1: a broker outage made the API answer 500; the row is the intent, the watchdog re-sends.
    backup = queued_backup(HOUR)
    response = operator_client.post(f"/api/v1/system/work/backup/{backup.pk}/retry")
    assert response.status_code == 202, response.content
    assert "the broker did not answer (OperationalError" in caplog.text
    backup.refresh_from_db()
    assert backup.state == "queued"


def test_retry_of_a_stopping_server_and_a_requested_artifact_sends_their_tasks(operator_client, sent):
    server = stopping_server(HOUR)
    artifact = requested_artifact(HOUR)
    assert operator_client.post(f"/api/v1/system/work/server/{server.pk}/retry").status_code == 202
    assert operator_client.post(f"/api/v1/system/work/artifact/{artifact.pk}/retry").status_code == 202
    assert sent == [("servers.stop_server", (str(server.pk),)), ("artifacts.acquire", (artifact.pk,))]


def test_retry_of_an_acquisition_whose_worker_died_acquires_it_again(operator_client, sent):
    artifact = requested_artifact(HOUR)
    artifact.transition("acquiring", detail="acquiring")  # no worker holds its lock: the worker is gone
    (row,) = rows_of(operator_client.get("/api/v1/system/work?kind=artifact"))
    assert (row["state"], row["stuck_after_seconds"], row["stuck"]) == ("acquiring", 0, True)

    assert operator_client.post(f"/api/v1/system/work/artifact/{artifact.pk}/retry").status_code == 202

    artifact.refresh_from_db()
    assert artifact.state == "requested"
    assert sent == [("artifacts.acquire", (artifact.pk,))]


def test_retry_of_an_acquisition_that_still_runs_is_work_not_waiting(operator_client, sent, settings):
    from apps.artifacts import locks

    artifact = requested_artifact(HOUR)
    artifact.transition("acquiring", detail="acquiring")
    with locks.acquiring(artifact.pk):  # a live worker holds it
        (row,) = rows_of(operator_client.get("/api/v1/system/work?kind=artifact"))
        assert (row["stuck_after_seconds"], row["stuck"]) == (settings.WORK_LONG_TASK_BOUND, False)
        message = assert_envelope(
            operator_client.post(f"/api/v1/system/work/artifact/{artifact.pk}/retry"), 409, "WORK_NOT_WAITING"
        )
    assert message == "Artifact bge-small is being acquired right now."
    artifact.refresh_from_db()
    assert artifact.state == "acquiring" and sent == []


# --- API: mark failed ---------------------------------------------------------------------------------


def test_fail_marks_a_stuck_backup_failed_with_work_cancelled_and_clears_its_alert(operator_client, sent):
    backup = queued_backup(HOUR)
    work.watch()
    assert Alert.objects.open().filter(code="WORK_STUCK", subject_id=str(backup.pk)).exists()

    response = operator_client.post(f"/api/v1/system/work/backup/{backup.pk}/fail")

    assert response.status_code == 200, response.content
    assert response.json() == {
        "kind": "backup",
        "id": str(backup.pk),
        "name": f"backup #{backup.pk}",
        "was": "queued",
        "state": "failed",
        "by": "operator-api-key",
    }
    backup.refresh_from_db()
    assert (backup.state, backup.reason_code) == ("failed", "WORK_CANCELLED")
    assert backup.reason_message == "marked failed by operator-api-key while queued"
    assert BackupEvent.objects.filter(backup=backup, to_state="failed").count() == 1
    assert not Alert.objects.open().filter(code="WORK_STUCK").exists()
    assert rows_of(operator_client.get("/api/v1/system/work")) == []


def test_fail_marks_an_artifact_a_restore_and_a_server_failed(operator_client):
    artifact = requested_artifact(HOUR)
    restore = queued_restore(HOUR)
    server = stopping_server(HOUR)
    for kind, pk in (("artifact", artifact.pk), ("restore", restore.pk), ("server", server.pk)):
        assert operator_client.post(f"/api/v1/system/work/{kind}/{pk}/fail").status_code == 200

    artifact.refresh_from_db()
    assert (artifact.state, artifact.failure_code) == ("failed", "WORK_CANCELLED")
    assert ArtifactEvent.objects.filter(artifact=artifact, to_state="failed").count() == 1
    restore.refresh_from_db()
    assert (restore.state, restore.failure_code) == ("failed", "WORK_CANCELLED")
    assert "service database was not touched" in restore.failure_message
    server.refresh_from_db()
    assert (server.state, server.failure_code) == ("failed", "WORK_CANCELLED")
    assert server.failure_message == "marked failed by operator-api-key while stopping"


def test_fail_marks_a_requested_replica_failed(operator_client):
    replica = requested_replica(HOUR)
    assert operator_client.post(f"/api/v1/system/work/replica/{replica.pk}/fail").status_code == 200
    replica.refresh_from_db()
    assert (replica.state, replica.reason) == (
        "failed",
        "WORK_CANCELLED: marked failed by operator-api-key while requested",
    )


# --- API: refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize("action", ["retry", "fail"])
def test_an_unknown_kind_is_work_kind_unknown(operator_client, action):
    backup = queued_backup(HOUR)
    message = assert_envelope(
        operator_client.post(f"/api/v1/system/work/backups/{backup.pk}/{action}"), 404, "WORK_KIND_UNKNOWN"
    )
    assert "'backups'" in message and "backup, restore, server, artifact, replica" in message
    backup.refresh_from_db()
    assert backup.state == "queued"


@pytest.mark.parametrize("action", ["retry", "fail"])
def test_a_row_not_waiting_is_work_not_waiting(operator_client, sent, action):
    verified = Backup.objects.create(state="verified", requested_at=ago(HOUR), verified_at=ago(HOUR))
    message = assert_envelope(
        operator_client.post(f"/api/v1/system/work/backup/{verified.pk}/{action}"), 409, "WORK_NOT_WAITING"
    )
    assert message == f"The backup {verified.pk} is not waiting any more; nothing was changed."
    verified.refresh_from_db()
    assert verified.state == "verified" and sent == []


def test_marking_a_row_failed_twice_is_work_not_waiting_the_second_time(operator_client):
    backup = queued_backup(HOUR)
    assert operator_client.post(f"/api/v1/system/work/backup/{backup.pk}/fail").status_code == 200
    assert_envelope(
        operator_client.post(f"/api/v1/system/work/backup/{backup.pk}/fail"), 409, "WORK_NOT_WAITING"
    )


@pytest.mark.parametrize("pk", ["999999", "not-a-number", "%00", "9223372036854775808", "-1"])
def test_ids_that_name_no_waiting_row_are_refused_by_name(operator_client, pk):
    queued_backup(HOUR)
    for kind in ("backup", "server"):
        assert_envelope(
            operator_client.post(f"/api/v1/system/work/{kind}/{pk}/retry"), 409, "WORK_NOT_WAITING"
        )


def test_retry_and_fail_are_posts(operator_client):
    backup = queued_backup(HOUR)
    assert_envelope(
        operator_client.get(f"/api/v1/system/work/backup/{backup.pk}/retry"), 405, "METHOD_NOT_ALLOWED"
    )


# --- dashboard ----------------------------------------------------------------------------------------


def test_the_work_page_lists_rows_with_links_bounds_stuck_badges_and_buttons(staff):
    backup = queued_backup(HOUR)
    artifact = requested_artifact(120)
    server = stopping_server(1800)
    restore = queued_restore(30)
    replica = requested_replica(HOUR)

    page = staff.get("/work/")

    assert page.status_code == 200
    html = page.content.decode()
    for url in (
        f"/backups/{backup.pk}/",
        f"/artifacts/{artifact.pk}/",
        f"/servers/{server.pk}/",
        f"/backups/restores/{restore.pk}/",
        f"/artifacts/{replica.artifact_id}/",
    ):
        assert f'href="{url}"' in html, url
    assert "a worker to take it" in html and "its agent to stop it" in html
    assert html.count('class="badge badge-warning stuck"') == 3  # backup, server, replica
    assert "1 h 0 min" in html and "10 min 0 s" in html  # the backup's age, the default bound
    for kind, pk in (("backup", backup.pk), ("server", server.pk), ("replica", replica.pk)):
        assert f'action="/work/{kind}/{pk}/retry"' in html
        assert f'action="/work/{kind}/{pk}/fail"' in html
    assert "csrfmiddlewaretoken" in html
    assert 'href="/work/" aria-current="page"' in html  # the navigation entry


def test_the_work_page_filters_like_the_api(staff):
    backup = queued_backup(HOUR)
    restore = queued_restore(30)
    html = staff.get("/work/?kind=&stuck=").content.decode()  # the form's "any"
    assert f"backup #{backup.pk}" in html and f"restore #{restore.pk}" in html
    html = staff.get("/work/?stuck=true").content.decode()
    assert f"backup #{backup.pk}" in html and f"restore #{restore.pk}" not in html
    html = staff.get("/work/?kind=restore").content.decode()
    assert f"backup #{backup.pk}" not in html and f"restore #{restore.pk}" in html


def test_a_filter_the_page_cannot_read_is_said_not_guessed(staff):
    backup = queued_backup(HOUR)
    page = staff.get("/work/?kind=jobs")
    assert page.status_code == 200
    html = page.content.decode()
    assert "VALIDATION_ERROR: kind:" in html
    assert f"backup #{backup.pk}" not in html


def test_the_work_page_is_for_staff_only(client):
    queued_backup(HOUR)
    response = client.get("/work/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")
    backup = Backup.objects.get()
    response = client.post(f"/work/backup/{backup.pk}/fail")
    assert response.status_code == 302 and response["Location"].startswith("/login/")
    assert Backup.objects.get().state == "queued"


def messages_of(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_retry_from_the_page_redirects_back_with_a_message(staff, sent):
    backup = queued_backup(HOUR)
    response = staff.post(f"/work/backup/{backup.pk}/retry", {"next": "/work/?kind=backup"})
    assert response.status_code == 302 and response["Location"] == "/work/?kind=backup"
    assert messages_of(response) == [f"Retried backup #{backup.pk}: its work was sent again."]
    assert sent == [("backups.take_backup", (backup.pk,))]


def test_mark_failed_from_the_page_redirects_with_a_message_and_the_row_is_gone(staff):
    backup = queued_backup(HOUR)
    response = staff.post(f"/work/backup/{backup.pk}/fail", follow=True)
    assert response.redirect_chain == [("/work/", 302)]
    html = response.content.decode()
    assert f"Marked backup #{backup.pk} failed (it was queued)." in html
    assert f'action="/work/backup/{backup.pk}/fail"' not in html
    backup.refresh_from_db()
    assert (backup.state, backup.reason_code) == ("failed", "WORK_CANCELLED")
    assert backup.reason_message == "marked failed by ops while queued"


def test_a_refusal_on_the_page_is_a_message_with_its_code(staff):
    verified = Backup.objects.create(state="verified", requested_at=ago(HOUR), verified_at=ago(HOUR))
    response = staff.post(f"/work/backup/{verified.pk}/fail")
    assert response.status_code == 302
    assert messages_of(response) == [
        f"WORK_NOT_WAITING: The backup {verified.pk} is not waiting any more; nothing was changed."
    ]
    response = staff.post("/work/jobs/1/retry")
    assert response.status_code == 302
    message = messages_of(response)[-1]
    assert message.startswith("WORK_KIND_UNKNOWN: No kind of work is called 'jobs'")


def test_the_page_never_redirects_off_site(staff):
    verified = Backup.objects.create(state="verified", requested_at=ago(HOUR), verified_at=ago(HOUR))
    response = staff.post(f"/work/backup/{verified.pk}/retry", {"next": "https://evil.example/"})
    assert response["Location"] == "/work/"


def test_the_buttons_are_posts_only(staff):
    backup = queued_backup(HOUR)
    assert staff.get(f"/work/backup/{backup.pk}/fail").status_code == 405
    assert Backup.objects.get().state == "queued"


def test_the_overview_counts_waiting_and_stuck_work(staff):
    queued_backup(HOUR)
    requested_artifact(HOUR)
    queued_restore(30)
    html = staff.get("/").content.decode()
    card = re.search(r'<section class="card" id="work">(.*?)</section>', html, re.S)
    assert card is not None
    assert "Work waiting: 3 (2 stuck)" in " ".join(card.group(1).split())
    assert 'href="/work/"' in card.group(1)


def test_the_overview_says_when_nothing_waits(staff):
    html = staff.get("/").content.decode()
    card = re.search(r'<section class="card" id="work">(.*?)</section>', html, re.S)
    assert card is not None and "Work waiting: 0" in " ".join(card.group(1).split())


# --- admin --------------------------------------------------------------------------------------------


def admin_action(client, changelist: str, action: str, pks: list[Any]):
    return client.post(
        changelist, {"action": action, "_selected_action": [str(pk) for pk in pks]}, follow=True
    )


def admin_messages(response) -> list[tuple[str, str]]:
    return [(m.level_tag, str(m)) for m in response.context["messages"]]


@pytest.mark.parametrize(
    "changelist",
    [
        "/admin/backups/backup/",
        "/admin/backups/restore/",
        "/admin/artifacts/artifact/",
        "/admin/artifacts/replica/",
        "/admin/servers/modelserver/",
    ],
)
def test_each_waiting_kind_has_retry_and_mark_failed_in_the_admin(superuser, changelist):
    # Django shows the actions only above a list with rows in it.
    for make in (queued_backup, queued_restore, requested_artifact, requested_replica, stopping_server):
        make(HOUR)
    html = superuser.get(changelist).content.decode()
    assert "Retry (re-send its task)" in html
    assert "Mark failed (WORK_CANCELLED)" in html


def test_the_admin_retries_each_selected_backup_with_one_message_per_row(superuser, sent):
    stuck = queued_backup(HOUR)
    verified = Backup.objects.create(state="verified", requested_at=ago(HOUR), verified_at=ago(HOUR))
    response = admin_action(superuser, "/admin/backups/backup/", "retry_work", [stuck.pk, verified.pk])
    assert response.status_code == 200
    assert sorted(admin_messages(response)) == sorted(
        [
            ("success", f"Retried backup #{stuck.pk}: its work was sent again."),
            (
                "error",
                f"Could not retry backup #{verified.pk} (verified): WORK_NOT_WAITING: "
                f"The backup {verified.pk} is not waiting any more; nothing was changed.",
            ),
        ]
    )
    assert sent == [("backups.take_backup", (stuck.pk,))]


def test_the_admin_marks_selected_rows_failed(superuser):
    backup = queued_backup(HOUR)
    restore = queued_restore(HOUR)
    artifact = requested_artifact(HOUR)
    replica = requested_replica(HOUR)
    server = stopping_server(HOUR)
    for changelist, pk in (
        ("/admin/backups/backup/", backup.pk),
        ("/admin/backups/restore/", restore.pk),
        ("/admin/artifacts/artifact/", artifact.pk),
        ("/admin/artifacts/replica/", replica.pk),
        ("/admin/servers/modelserver/", server.pk),
    ):
        response = admin_action(superuser, changelist, "fail_work", [pk])
        (level, message) = admin_messages(response)[0]
        assert level == "success" and message.startswith("Marked "), (changelist, message)
    for row in (backup, restore, artifact, replica, server):
        row.refresh_from_db()
        assert row.state == "failed", row
    assert (backup.reason_message, artifact.failure_code) == (
        "marked failed by root-ops while queued",
        "WORK_CANCELLED",
    )


def test_the_admin_keeps_the_servers_own_actions_beside_the_work_ones(superuser):
    stopping_server(HOUR)
    html = superuser.get("/admin/servers/modelserver/").content.decode()
    for label in ("Stop selected servers", "Restart (failed servers", "Re-place", "Delete (with tombstone)"):
        assert label in html


# --- in a real browser --------------------------------------------------------------------------------


@pytest.mark.browser
@pytest.mark.stack
@pytest.mark.django_db(transaction=True)
def test_an_operator_marks_a_stuck_queued_backup_failed_from_the_work_page(live_web, browser):
    User.objects.create_superuser("ops", email="", password="correct-horse-battery-9")
    backup = queued_backup(HOUR)
    page = browser.new_page()
    try:
        log_in(page, live_web.url, "ops", "correct-horse-battery-9")
        page.click("nav >> text=Work")
        page.wait_for_selector("h1:has-text('Work')")
        row = page.locator(f"tr#work-backup-{backup.pk}")
        assert "stuck" in row.inner_text()
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "dashboard-work.png"), full_page=True)

        row.locator("button:has-text('Mark failed')").click()
        page.wait_for_selector(f"text=Marked backup #{backup.pk} failed")
        assert page.locator(f"tr#work-backup-{backup.pk}").count() == 0
        page.screenshot(path=str(ARTIFACTS / "dashboard-work-marked-failed.png"), full_page=True)
    finally:
        page.close()
    backup.refresh_from_db()
    assert (backup.state, backup.reason_code, backup.reason_message) == (
        "failed",
        "WORK_CANCELLED",
        "marked failed by ops while queued",
    )


@pytest.fixture
def broker_refuses_pings(monkeypatch) -> None:
    """A ping and a worker probe fail to publish the way kombu fails when Redis refuses or does not answer
    within MODELFORGE_BROKER_TIMEOUT_S (tests/test_broker_freeze.py freezes a real one)."""
    from apps.core import tasks as core_tasks
    from apps.nodes import tasks as node_tasks

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(node_tasks.ping_node, "apply_async", refuse)
    monkeypatch.setattr(core_tasks.record_worker_seen, "apply_async", refuse)
    monkeypatch.setattr(dispatch, "_outage", dispatch._Outage())


@pytest.mark.django_db(transaction=True)
def test_a_ping_or_probe_the_broker_cannot_take_is_refused_by_name_not_a_500(
    operator_client, staff, broker_refuses_pings
):
    # Issue 48: with no row for the watchdog to re-send, a ping or a worker probe the broker did not take
    # is lost; the operator is told so by name (and the dashboard says it), never a 500.
    node, _ = make_node("n-ping")
    response = operator_client.post(f"/api/v1/nodes/{node.pk}/ping")
    assert "Nothing was sent" in assert_envelope(response, 503, "BROKER_UNREACHABLE")
    response = operator_client.post("/api/v1/system/worker-probe")
    assert "Nothing was sent" in assert_envelope(response, 503, "BROKER_UNREACHABLE")
    response = staff.post(f"/nodes/{node.pk}/ping", follow=True)
    assert response.status_code == 200
    said = [str(m) for m in get_messages(response.wsgi_request)]
    assert any("BROKER_UNREACHABLE" in m and "Nothing was sent" in m for m in said), said
