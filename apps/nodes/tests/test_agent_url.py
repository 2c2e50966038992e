"""An agent's URL, as the docs say it (issue 47): http or https, a host (a name, an IPv4 address or an IPv6
address in brackets), a port from 1 to 65535 and nothing else. Enrollment and heartbeats refuse any other,
and the OpenAPI document's pattern for it says exactly what the server takes."""

from __future__ import annotations

import ipaddress
import re

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from apps.nodes.agent_url import AGENT_URL, refusal
from apps.nodes.models import EnrollmentToken, Node

ENROLL = "/api/v1/agent/enroll"

ACCEPTED = [
    "http://10.0.0.5:8471",
    "http://gpu-01:8471",
    "https://gpu-01.lan:443",
    "http://3f9c2a1b7d4e:8471",  # a container's host name
    "http://node_a:1",
    "http://[::1]:8471",
    "http://[fd00::5]:65535",
    "HTTP://GPU-01:8471",
    "http://gpu-01:8471/",
]
REFUSED = {
    "https://x y:80": "space",
    "http://h": "no port",
    "http://a:0": "port 0",
    "http://a:65536": "port 65536",
    "http://a:": "empty port",
    "http://a:08471": "leading zero",
    "http://user:pw@gpu-01:8471": "userinfo",
    "http://@gpu-01:8471": "empty userinfo",
    "ftp://gpu-01:21": "scheme",
    "gpu-01:8471": "no scheme",
    "http://:8471": "no host",
    "http://999.1.1.1:8471": "not an IPv4 address",
    "http://10.0.0.256:8471": "octet",
    "http://[::g]:8471": "not an IPv6 address",
    "http://::1:8471": "IPv6 without brackets",
    "http://a..b:8471": "empty label",
    "http://" + "a" * 64 + ":8471": "label over 63",
    "http://gpu-01:8471/agent": "path",
    "http://gpu-01:8471?x=1": "query",
    "http://gpu-01:8471#x": "fragment",
    "http://gpu%2d01:8471": "percent-encoded host",
    "http://gpü:8471": "non-ASCII host",
    " http://gpu-01:8471": "leading space",
}


@pytest.fixture
def schema_pattern(operator_client) -> re.Pattern[str]:
    """The pattern the OpenAPI document served at /api/v1/schema/ states for the enrollment's agent_url."""
    document = operator_client.get("/api/v1/schema/?format=json").json()
    field = document["components"]["schemas"]["EnrollRequestRequest"]["properties"]["agent_url"]
    return re.compile(field["pattern"])


@pytest.mark.django_db
def test_enrollment_takes_an_agent_url_exactly_when_the_schema_s_pattern_does(schema_pattern):
    # Regression (issue 47): "https://x y:80", "http://h" and "http://a:0" were enrolled.
    _, token = EnrollmentToken.objects.mint()
    body = {"token": token, "name": "n1", "accelerator": "cpu", "agent_version": "0.1.0"}
    for url, why in REFUSED.items():
        answer = APIClient().post(ENROLL, {**body, "agent_url": url}, format="json")
        assert answer.status_code == 400, (why, answer.content)
        refused = answer.json()
        assert set(refused) == {"code", "message", "correlation_id"}
        assert refused["code"] == "VALIDATION_ERROR" and "agent_url" in refused["message"], why
        assert "such as http://gpu-01:8471" in refused["message"], why
        assert not schema_pattern.search(url), why
    assert not Node.objects.exists() and EnrollmentToken.objects.get().used_at is None
    for number, url in enumerate(ACCEPTED):
        _, token = EnrollmentToken.objects.mint()
        answer = APIClient().post(
            ENROLL, {**body, "token": token, "name": f"n{number}", "agent_url": url}, format="json"
        )
        assert answer.status_code == 201, (url, answer.content)
        assert schema_pattern.search(url), url


def test_the_refusal_says_what_is_wrong():
    assert "no port" in str(refusal("http://h"))
    assert "1 to 65535" in str(refusal("http://a:0"))
    assert "space" in str(refusal("https://x y:80"))
    assert "user name" in str(refusal("http://user:pw@gpu-01:8471"))
    assert "http or https" in str(refusal("ftp://gpu-01:21"))
    assert "path" in str(refusal("http://gpu-01:8471/agent"))
    assert refusal("http://gpu-01:8471") is None


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.from_regex(AGENT_URL, fullmatch=True))
def test_every_url_the_pattern_admits_can_be_called(url):
    """What the pattern admits (and so the schema states) the control plane can call: httpx parses it with
    its port, and an IPv6 host is an address."""
    assert refusal(url) is None
    parsed = httpx.URL(url)
    assert 1 <= (parsed.port or 0) <= 65535
    if url.split("//", 1)[1].startswith("["):
        ipaddress.IPv6Address(parsed.host)
