"""One channel never holds up another (issue 47): channels named with braces, webhooks that answer with
braces, a webhook that never answers and a channel whose sending throws are each recorded on their own
channel with NOTIFICATION_FAILED, while a good channel, served by a real receiver, gets every alert in the
same pass. Every webhook here is a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.utils import timezone

from apps.alerts import notify
from apps.alerts.models import Alert, Notification, NotificationChannel
from tests.fixtures import wait_until

pytestmark = pytest.mark.django_db

NAMES = ["x{", "}", "{0}", "%s", "{name}"]


class Hook:
    """A real webhook receiver: answers ``status`` with ``body`` and records what it was sent; ``hold``
    (when set) is waited on before answering, up to 30 s, and whether ``seen`` was set meanwhile is noted."""

    def __init__(self, status: int = 204, body: bytes = b"") -> None:
        self.status, self.body = status, body
        self.bodies: list[bytes] = []
        self.arrived = threading.Event()
        self.hold: threading.Event | None = None
        self.held_until_set: list[bool] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                server.bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
                server.arrived.set()
                if server.hold is not None:
                    server.held_until_set.append(server.hold.wait(30))
                    self.close_connection = True
                    return  # no answer at all: the connection is closed on the client
                self.send_response(server.status)
                self.send_header("Content-Length", str(len(server.body)))
                self.end_headers()
                self.wfile.write(server.body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def events(self) -> list[dict]:
        return [event for body in self.bodies for event in json.loads(body)["events"]]


@pytest.fixture
def hooks() -> Iterator[list[Hook]]:
    made: list[Hook] = []
    yield made
    for hook in made:
        hook.server.shutdown()
        hook.server.server_close()


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A real TCP server that accepts connections and reads, but never answers a byte."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            accepted.append(conn)

    threading.Thread(target=serve, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/hook"
    stop.set()
    for conn in accepted:
        conn.close()
    listener.close()


def channel(name: str, target: str, kind: str = "webhook") -> NotificationChannel:
    created = timezone.now() - timedelta(minutes=1)
    return NotificationChannel.objects.create(name=name, kind=kind, target=target, created_at=created)


def raise_nodes(count: int) -> None:
    for i in range(count):
        Alert.objects.raise_alert(
            "NODE_OFFLINE", "critical", "node", str(i), f"gpu-{i}", f"gpu-{i} is offline."
        )


def failure_alert(name: str) -> Alert:
    return Alert.objects.open().get(code="NOTIFICATION_FAILED", subject_name=name)


def test_channels_named_with_braces_whose_webhooks_answer_braces_each_fail_alone(hooks):
    # A channel whose webhook answered 500 {"error": ...}, or a channel named x{, crashed the whole pass.
    for name in NAMES:
        hooks.append(Hook(500, b'{"error": "service unavailable {0} %s {name}"}'))
        channel(name, hooks[-1].url)
    good = Hook()
    hooks.append(good)
    channel("zz-good", good.url)  # delivered after every bad one, in name order
    raise_nodes(3)

    notify.sweep()

    assert sorted(e["subject_name"] for e in good.events()) == ["gpu-0", "gpu-1", "gpu-2"]
    for name in NAMES:
        alert = failure_alert(name)
        assert alert.message.startswith(f"Channel {name} could not deliver 3 alert event(s): POST ")
        assert 'answered 500: {"error": "service unavailable {0} %s {name}"}' in alert.message
        bad = NotificationChannel.objects.get(name=name)
        assert bad.last_failure_at is not None and "answered 500" in bad.last_error
        assert set(Notification.objects.filter(channel=bad).values_list("state", "attempts")) == {
            ("pending", 1)
        }
    # The NOTIFICATION_FAILED alerts themselves reach the good channel on the next pass.
    notify.sweep()
    assert {e["subject_name"] for e in good.events() if e["code"] == "NOTIFICATION_FAILED"} == set(NAMES)


def test_a_webhook_that_holds_its_answer_does_not_hold_up_another_channel(hooks, settings):
    settings.NOTIFY_TIMEOUT_S = 120  # longer than the held hook waits: only the other delivery frees it
    held, good = Hook(), Hook()
    hooks.extend([held, good])
    held.hold = good.arrived  # the held hook answers (by hanging up) only once the good one has its POST
    channel("a-held", held.url)
    channel("b-good", good.url)
    raise_nodes(1)

    notify.sweep()

    assert held.held_until_set == [True]  # the good channel was served while the first one was held
    assert [e["subject_name"] for e in good.events()] == ["gpu-0"]
    assert "could not deliver 1 alert event(s)" in failure_alert("a-held").message


def test_a_webhook_that_never_answers_is_a_timeout_on_its_channel_alone(hooks, silent_server, settings):
    settings.NOTIFY_TIMEOUT_S = 1
    good = Hook()
    hooks.append(good)
    channel("a-silent", silent_server)
    channel("b-good", good.url)
    raise_nodes(2)

    result = notify.sweep()

    assert result["sent"] == 2
    assert sorted(e["subject_name"] for e in good.events()) == ["gpu-0", "gpu-1"]
    silent = NotificationChannel.objects.get(name="a-silent")
    assert "Timeout" in silent.last_error or "no answer within 1 s" in silent.last_error
    assert "could not deliver 2 alert event(s)" in failure_alert("a-silent").message


def test_a_channel_whose_sending_throws_is_recorded_and_the_others_still_deliver(hooks, monkeypatch):
    # Not a DeliveryFailed: a fault of our own (here, e-mail sending) must not end the pass either.
    def broken(channel: NotificationChannel, events: list[dict]) -> None:
        raise RuntimeError("the e-mail side broke {0}")

    monkeypatch.setattr(notify, "_mail", broken)
    good = Hook()
    hooks.append(good)
    channel("a-mail", "ops@example.com", kind="email")
    channel("b-good", good.url)
    raise_nodes(1)

    notify.sweep()

    assert [e["subject_name"] for e in good.events()] == ["gpu-0"]
    mail = NotificationChannel.objects.get(name="a-mail")
    assert mail.last_error == "RuntimeError: the e-mail side broke {0}"
    assert "RuntimeError: the e-mail side broke {0}" in failure_alert("a-mail").message


def test_the_test_action_on_a_silent_webhook_is_a_refusal_after_the_timeout(silent_server, settings, client):
    from django.contrib.auth.models import User

    settings.NOTIFY_TIMEOUT_S = 1
    silent = channel("x{0}", silent_server)
    client.force_login(User.objects.create_user("ops", is_staff=True))
    page = client.post(f"/alerts/channels/{silent.pk}/test", follow=True).content.decode()
    assert "NOTIFICATION_FAILED: channel x{0}: " in page
    silent.refresh_from_db()
    assert "Timeout" in silent.last_error or "no answer within 1 s" in silent.last_error


def test_a_claimed_batch_is_left_to_its_pass_and_due_again_if_that_pass_died(hooks, settings):
    settings.NOTIFY_TIMEOUT_S = 5
    good = Hook()
    hooks.append(good)
    hook = channel("ops", good.url)
    raise_nodes(1)
    now = timezone.now()
    notify.enqueue(now)
    claimed = notify._claim(hook, now, 1)  # another pass's claim, and that pass died before sending
    assert claimed is not None
    assert notify.sweep(now)["sent"] == 0 and good.bodies == []
    after_lease = claimed.lease + timedelta(seconds=1)
    assert notify.sweep(after_lease)["sent"] == 1
    assert [e["subject_name"] for e in good.events()] == ["gpu-0"]


@pytest.mark.django_db(transaction=True)
def test_the_worker_delivers_to_the_good_channel_past_one_named_with_a_brace(celery_worker_process, hooks):
    # The issue as it was seen: a channel named x{ whose webhook answered 500 {"error": ...} crashed
    # alerts.notify every pass; the good channel stayed pending with 0 attempts, and nothing said so.
    from apps.alerts.tasks import notify_alerts

    bad, good = Hook(500, b'{"error": "service unavailable"}'), Hook()
    hooks.extend([bad, good])
    channel("x{", bad.url)
    channel("y-good", good.url)
    raise_nodes(2)
    notify_alerts.delay()  # what beat sends every MODELFORGE_NOTIFY_INTERVAL seconds
    assert wait_until(lambda: len(good.events()) == 2, 30), celery_worker_process.log()[-2000:]
    assert wait_until(
        lambda: Alert.objects.open().filter(code="NOTIFICATION_FAILED", subject_name="x{").exists(), 30
    )
    states = Notification.objects.filter(channel__name="y-good").values_list("state", flat=True)
    assert set(states) == {"sent"}
