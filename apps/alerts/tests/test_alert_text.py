"""Alert messages are data: operator and remote text with braces or percent signs is stored as it was
written, never parsed as a template (issue 47: a channel named ``x{`` or a cluster named ``fz{team}``
crashed the code that raised their alerts)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from apps.alerts.models import Alert

pytestmark = pytest.mark.django_db

# Every shape that str.format or %-formatting would read as a field, a bad template or an escape.
NAMES = ["x{", "}", "{0}", "%s", "{name}", "fz{team}", "{{double}}", "{name!r:>9}"]


@pytest.mark.parametrize("name", NAMES)
def test_raise_alert_stores_the_message_and_the_name_as_written(name):
    message = (
        f'Channel {name} could not deliver: POST answered 500: {{"error": "service unavailable"}} {name}'
    )
    assert Alert.objects.raise_alert(
        "NOTIFICATION_FAILED", "warning", "notification_channel", "1", name, message
    )
    alert = Alert.objects.get()
    assert (alert.subject_name, alert.message) == (name, message)


@pytest.mark.parametrize("name", NAMES)
def test_raise_many_puts_each_name_between_literal_pieces(name):
    from apps.alerts.models import AroundName

    # The pieces themselves hold braces too: they are text, not a template.
    message = AroundName("Node ", " is offline {0} {name} 100 % {{x}}: ", ".")
    subjects = [("a", name), ("b", "gpu-b")]
    assert Alert.objects.raise_many("node_offline", "critical", "node", subjects, message) == 2
    assert (
        Alert.objects.get(subject_id="a").message
        == f"Node {name} is offline {{0}} {{name}} 100 % {{{{x}}}}: {name}."
    )
    assert Alert.objects.get(subject_id="b").message == "Node gpu-b is offline {0} {name} 100 % {{x}}: gpu-b."


def test_raise_many_with_plain_text_gives_every_subject_that_text():
    subjects = [("a", "{a}"), ("b", "b{")]
    assert Alert.objects.raise_many("NODE_STALE", "warning", "node", subjects, "{name} is {stale}") == 2
    assert set(Alert.objects.values_list("message", flat=True)) == {"{name} is {stale}"}


def test_the_dashboard_shows_alert_text_escaped_and_unformatted(client):
    # Rendering treats the message as data: autoescaped, never a template of its own.
    Alert.objects.raise_alert(
        "NOTIFICATION_FAILED",
        "warning",
        "notification_channel",
        "1",
        "<b>{{ x }}</b>",
        "{% now 'Y' %} <i>{0}</i>",
    )
    client.force_login(User.objects.create_user("ops", is_staff=True))
    page = client.get("/alerts/").content.decode()
    assert "&lt;b&gt;{{ x }}&lt;/b&gt;" in page
    assert "{% now &#x27;Y&#x27; %} &lt;i&gt;{0}&lt;/i&gt;" in page
