"""Alert notifications: real webhook receivers and a real SMTP server on 127.0.0.1, batches, severity,
signatures, retries with a growing delay, NOTIFICATION_FAILED raised and cleared, and the API,
dashboard and worker around them."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from apps.alerts import notify
from apps.alerts.models import Alert, AroundName, Notification, NotificationChannel
from apps.core.models import Installation
from tests.fixtures import free_port, wait_until

pytestmark = pytest.mark.django_db


class Receiver:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.signatures: list[str | None] = []
        self.status = 204


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, str]]:
    """A real webhook receiver on 127.0.0.1 that records what it is sent."""
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            state.bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
            state.signatures.append(self.headers.get("X-ModelForge-Signature"))
            self.send_response(state.status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield state, f"http://127.0.0.1:{server.server_address[1]}/hook"
    server.shutdown()


def events(receiver: Receiver) -> list[dict]:
    return [event for body in receiver.bodies for event in json.loads(body)["events"]]


def channel(**fields) -> NotificationChannel:
    created = timezone.now() - timedelta(minutes=1)
    return NotificationChannel.objects.create(**{"name": "ops", "created_at": created, **fields})


def raise_nodes(count: int, code: str = "NODE_OFFLINE", severity: str = "critical") -> None:
    Alert.objects.raise_many(
        code,
        severity,
        "node",
        [(str(i), f"gpu-{i}") for i in range(count)],
        AroundName("Node ", " is offline."),
    )


def test_a_mass_outage_is_a_few_batched_posts_and_a_clear_is_sent_once(receiver):
    state, url = receiver
    channel(kind="webhook", target=url)
    raise_nodes(150)
    result = notify.sweep()
    assert result == {"recorded": 150, "sent": 150, "failed": 0}
    assert len(state.bodies) == 2  # 100 + 50, not 150 messages
    sent = events(state)
    assert len(sent) == 150 and {e["event"] for e in sent} == {"raised"}
    assert sent[0]["code"] == "NODE_OFFLINE" and sent[0]["severity"] == "critical"
    assert sent[0]["message"].startswith("Node gpu-") and sent[0]["cleared_at"] is None

    assert notify.sweep() == {"recorded": 0, "sent": 0, "failed": 0}  # nothing twice
    raise_nodes(150)  # raised again while open: the same alerts, no new events
    assert notify.sweep()["recorded"] == 0

    Alert.objects.clear_for(["NODE_OFFLINE"], "node", "7")
    notify.sweep()
    last = json.loads(state.bodies[-1])["events"]
    assert [(e["event"], e["subject_name"]) for e in last] == [("cleared", "gpu-7")]
    assert last[0]["cleared_at"] is not None
    assert Notification.objects.filter(state="sent").count() == 151


def test_a_channel_gets_only_its_severity_and_nothing_from_before_it_existed(receiver):
    state, url = receiver
    Alert.objects.raise_alert(
        "OLD", "critical", "node", "1", "n1", "old", timezone.now() - timedelta(hours=1)
    )
    channel(kind="webhook", target=url, min_severity="critical")
    Alert.objects.raise_alert("BACKUP_STALE", "warning", "installation", "x", "x", "stale")
    Alert.objects.raise_alert("NODE_OFFLINE", "critical", "node", "2", "n2", "offline")
    notify.sweep()
    assert [e["code"] for e in events(state)] == ["NODE_OFFLINE"]


def test_a_signed_webhook_carries_the_hmac_of_its_body(receiver):
    state, url = receiver
    channel(kind="webhook", target=url, secret="s3cret-for-hooks")
    raise_nodes(1)
    notify.sweep()
    expected = hmac.new(b"s3cret-for-hooks", state.bodies[0], hashlib.sha256).hexdigest()
    assert state.signatures == [f"sha256={expected}"]


def test_a_failing_channel_retries_later_gives_up_and_says_so_then_recovers(receiver, settings):
    state, url = receiver
    settings.NOTIFY_MAX_ATTEMPTS = 3
    settings.NOTIFY_INTERVAL = 10
    hook = channel(kind="webhook", target=f"http://127.0.0.1:{free_port()}/nobody-listens")
    raise_nodes(2)
    now = timezone.now()
    assert notify.sweep(now) == {"recorded": 2, "sent": 0, "failed": 0}  # retrying, not failed yet
    pending = list(Notification.objects.filter(channel=hook))
    assert {n.attempts for n in pending} == {1} and {n.state for n in pending} == {"pending"}
    assert all(n.next_attempt_at == now + timedelta(seconds=10) for n in pending)
    assert "ConnectError" in pending[0].last_error
    failed_alert = Alert.objects.open().get(code="NOTIFICATION_FAILED")
    assert failed_alert.subject_name == "ops" and "Next try in 10 s" in failed_alert.message

    early = notify.sweep(now + timedelta(seconds=5))  # not due yet: nothing is tried
    assert early["sent"] == 0 and early["failed"] == 0
    assert set(
        Notification.objects.filter(channel=hook, alert__code="NODE_OFFLINE").values_list(
            "attempts", flat=True
        )
    ) == {1}
    notify.sweep(now + timedelta(seconds=11))  # second attempt; the delay doubles
    second = Notification.objects.filter(channel=hook, alert__code="NODE_OFFLINE").first()
    assert second is not None and second.attempts == 2
    assert second.next_attempt_at == now + timedelta(seconds=11 + 20)
    result = notify.sweep(now + timedelta(seconds=40))  # third: gives up
    assert result["failed"] >= 2
    assert set(
        Notification.objects.filter(channel=hook, alert__code="NODE_OFFLINE").values_list("state", flat=True)
    ) == {"failed"}
    assert "Gave up" in Alert.objects.open().get(code="NOTIFICATION_FAILED").message

    # Pointed at a working receiver, the next delivery succeeds and clears NOTIFICATION_FAILED.
    NotificationChannel.objects.filter(pk=hook.pk).update(target=url)
    raise_nodes(1, code="GPU_LOST")
    notify.sweep(now + timedelta(seconds=50))
    assert [e["code"] for e in events(state)][:1] == ["GPU_LOST"]
    assert not Alert.objects.open().filter(code="NOTIFICATION_FAILED").exists()
    hook.refresh_from_db()
    assert hook.last_success_at is not None and hook.last_error == ""


def test_an_answer_that_is_not_2xx_is_a_failure_with_the_status(receiver):
    state, url = receiver
    state.status = 500
    channel(kind="webhook", target=url)
    raise_nodes(1)
    notify.sweep()
    assert "answered 500" in Notification.objects.get().last_error


@pytest.fixture
def smtp_server(settings) -> Iterator[list]:
    """A real SMTP server (aiosmtpd) on 127.0.0.1, and the settings pointing at it."""
    from aiosmtpd.controller import Controller

    received: list = []

    class Handler:
        async def handle_DATA(self, server, session, envelope):
            received.append(envelope)
            return "250 OK"

    port = free_port()
    controller = Controller(Handler(), hostname="127.0.0.1", port=port)
    controller.start()
    settings.EMAIL_URL = f"smtp://127.0.0.1:{port}"
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", port
    settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
    settings.DEFAULT_FROM_EMAIL = "modelforge@example.com"
    yield received
    controller.stop()


def test_an_email_channel_sends_one_message_per_batch_through_smtp(smtp_server):
    channel(kind="email", target="ops@example.com, oncall@example.com")
    raise_nodes(3)
    notify.sweep()
    assert len(smtp_server) == 1
    envelope = smtp_server[0]
    assert sorted(envelope.rcpt_tos) == ["oncall@example.com", "ops@example.com"]
    text = envelope.content.decode()
    assert "Subject: [ModelForge] NODE_OFFLINE raised: gpu-0 (and 2 more)" in text
    assert text.count("NODE_OFFLINE on node gpu-") == 3


def test_an_email_carries_names_and_messages_as_text(smtp_server):
    # A name is data: a line break in it is not a header of its own, braces are not a template.
    channel(kind="email", target="ops@example.com")
    Alert.objects.raise_alert(
        "NODE_OFFLINE", "critical", "node", "1", "gpu{0}\nBcc: x@example.com", "gpu {name} is %s offline."
    )
    notify.sweep()
    text = smtp_server[0].content.decode()
    assert "Subject: [ModelForge] NODE_OFFLINE raised: gpu{0} Bcc: x@example.com" in text
    assert "\nBcc:" not in text.split("\r\n\r\n")[0] and smtp_server[0].rcpt_tos == ["ops@example.com"]
    assert "gpu {name} is %s offline." in text


def test_an_email_channel_without_smtp_settings_fails_by_name(settings):
    settings.EMAIL_URL = None
    channel(kind="email", target="ops@example.com")
    raise_nodes(1)
    notify.sweep()
    assert "MODELFORGE_EMAIL_URL is not set" in Notification.objects.get().last_error


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "h", "kind": "webhook", "target": "ftp://example.com/x"}, "target"),
        ({"name": "h", "kind": "webhook", "target": "not a url"}, "target"),
        ({"name": "m", "kind": "email", "target": "ops@example.com, nobody"}, "target"),
        ({"name": "m", "kind": "email", "target": "ops@example.com", "secret": "x"}, "secret"),
        ({"name": "m", "kind": "pager", "target": "x"}, "kind"),
        (
            {"name": "m", "kind": "webhook", "target": "https://h.example", "min_severity": "loud"},
            "min_severity",
        ),
    ],
)
def test_the_api_refuses_a_bad_channel_by_field(operator_client, body, field):
    response = operator_client.post("/api/v1/notification-channels", body, format="json")
    assert response.status_code == 400 and response.json()["code"] == "VALIDATION_ERROR"
    assert field in json.dumps(response.json()) and not NotificationChannel.objects.exists()


def test_the_api_creates_tests_and_lists_channels_and_their_notifications(operator_client, receiver):
    state, url = receiver
    created = operator_client.post(
        "/api/v1/notification-channels",
        {"name": "hook", "kind": "webhook", "target": url, "secret": "abc", "min_severity": "critical"},
        format="json",
    )
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["has_secret"] is True and "secret" not in body and body["created_by"]
    tested = operator_client.post(f"/api/v1/notification-channels/{body['id']}/test")
    assert tested.status_code == 200 and tested.json()["last_success_at"]
    assert [e["code"] for e in events(state)] == ["NOTIFICATION_TEST"]

    broken = operator_client.post(
        "/api/v1/notification-channels",
        {"name": "dead", "kind": "webhook", "target": f"http://127.0.0.1:{free_port()}/"},
        format="json",
    ).json()
    refused = operator_client.post(f"/api/v1/notification-channels/{broken['id']}/test")
    assert refused.status_code == 502 and refused.json()["code"] == "NOTIFICATION_FAILED"
    assert "dead" in refused.json()["message"]

    NotificationChannel.objects.filter(name="hook").update(created_at=timezone.now() - timedelta(minutes=1))
    NotificationChannel.objects.filter(name="dead").update(enabled=False)
    raise_nodes(1)
    notify.sweep()
    listed = operator_client.get("/api/v1/notifications?state=sent").json()
    rows = listed["results"] if isinstance(listed, dict) else listed
    assert [(r["channel_name"], r["code"], r["event"]) for r in rows] == [("hook", "NODE_OFFLINE", "raised")]


def test_the_dashboard_adds_tests_disables_and_deletes_a_channel(client, receiver):
    state, url = receiver
    client.force_login(User.objects.create_user("ops", is_staff=True))
    bad = client.post(
        "/alerts/channels/create", {"name": "x", "kind": "webhook", "target": "nope"}, follow=True
    )
    assert "VALIDATION_ERROR" in bad.content.decode() and not NotificationChannel.objects.exists()
    client.post(
        "/alerts/channels/create",
        {"name": "hook", "kind": "webhook", "target": url, "min_severity": "warning"},
    )
    hook = NotificationChannel.objects.get(name="hook")
    assert hook.created_by == "ops"
    page = client.post(f"/alerts/channels/{hook.pk}/test", follow=True).content.decode()
    assert "Test message delivered through hook" in page and len(state.bodies) == 1
    client.post(f"/alerts/channels/{hook.pk}/disable")
    hook.refresh_from_db()
    assert not hook.enabled
    page = client.get("/alerts/channels/").content.decode()
    assert "MODELFORGE_EMAIL_URL" in page and "disabled" in page
    client.post(f"/alerts/channels/{hook.pk}/delete")
    assert not NotificationChannel.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_the_worker_delivers_on_the_beat_task(celery_worker_process, receiver):
    from apps.alerts.tasks import notify_alerts

    state, url = receiver
    channel(kind="webhook", target=url)
    raise_nodes(2)
    notify_alerts.delay()  # what beat sends every MODELFORGE_NOTIFY_INTERVAL seconds
    assert wait_until(lambda: len(events(state)) == 2, 30), celery_worker_process.log()[-2000:]
    assert sorted(e["subject_name"] for e in events(state)) == ["gpu-0", "gpu-1"]
    assert set(Notification.objects.values_list("state", flat=True)) == {"sent"}
    # Each completed pass stamps the installation: what NOTIFY_STALLED is raised from.
    assert wait_until(lambda: Installation.objects.current().notify_passed_at is not None, 30)
