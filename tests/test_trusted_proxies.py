"""Forwarded headers are believed from MODELFORGE_TRUSTED_PROXIES only (issue 47): by default from nobody,
so a process on the machine cannot choose the address the authentication-failure block counts. Real
gunicorn processes; the operator API (Django) and the heartbeat (the lean request cycle) alike."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import httpx
import pytest

from apps.nodes.tests.factories import heartbeat_report
from modelforge.proxies import TrustedProxies
from tests.fixtures import start_web

pytestmark = pytest.mark.django_db(transaction=True)

WRONG = {"Authorization": "Bearer not-the-operator-key-not-the-operator-key"}
STATUS = "/api/v1/system/status"
HEARTBEAT = "/api/v1/agent/heartbeat"
LIMIT = 3


def web(tmp_path: Path, **overrides: str):
    return start_web(
        tmp_path / "web.log",
        MODELFORGE_API_AUTH_FAILURE_LIMIT=str(LIMIT),
        MODELFORGE_API_AUTH_FAILURE_WINDOW="60",
        **overrides,
    )


def heartbeat(client: httpx.Client, **headers: str) -> httpx.Response:
    return client.post(
        HEARTBEAT,
        content=json.dumps(heartbeat_report()).encode(),
        headers={"Content-Type": "application/json", "Authorization": "Bearer mfn_not-a-node", **headers},
    )


def test_by_default_a_forwarded_address_is_not_believed(tmp_path):
    # Regression (issue 47): from 127.0.0.1 each made-up X-Forwarded-For was counted as an address of its
    # own, so guesses were never blocked; they all come from 127.0.0.1, and are counted there.
    running = web(tmp_path)
    try:
        with httpx.Client(base_url=running.url, timeout=10) as client:
            answers = [
                client.get(STATUS, headers={**WRONG, "X-Forwarded-For": f"203.0.113.{i}"})
                for i in range(LIMIT)
            ]
            assert [a.status_code for a in answers] == [401] * (LIMIT - 1) + [429]
            assert "failed from 127.0.0.1 " in answers[-1].json()["message"]
            # The heartbeat's own request cycle reads the peer too.
            beats = [heartbeat(client, **{"X-Forwarded-For": f"198.51.100.{i}"}) for i in range(LIMIT)]
            assert [b.status_code for b in beats] == [401] * (LIMIT - 1) + [429]
            assert "failed from 127.0.0.1 " in beats[-1].json()["message"]
    finally:
        running.process.stop()


def test_behind_a_trusted_proxy_the_client_it_names_is_counted(tmp_path):
    running = web(tmp_path, MODELFORGE_TRUSTED_PROXIES="127.0.0.1,10.9.0.0/16")
    try:
        with httpx.Client(base_url=running.url, timeout=10) as client:
            # What the client wrote (left) is not believed past the first address a trusted proxy did not
            # add: here 203.0.113.7, whatever it claimed before it.
            chains = [f"192.0.2.{i}, 203.0.113.7, 10.9.1.1" for i in range(LIMIT)]
            answers = [client.get(STATUS, headers={**WRONG, "X-Forwarded-For": c}) for c in chains]
            assert [a.status_code for a in answers] == [401] * (LIMIT - 1) + [429]
            assert "failed from 203.0.113.7 " in answers[-1].json()["message"]
            # Another client behind the same proxy is not held up, nor is the proxy itself.
            assert client.get(STATUS, headers={**WRONG, "X-Forwarded-For": "203.0.113.8"}).status_code == 401
            assert client.get(STATUS, headers=WRONG).status_code == 401
            beats = [heartbeat(client, **{"X-Forwarded-For": "198.51.100.9"}) for _ in range(LIMIT)]
            assert [b.status_code for b in beats] == [401] * (LIMIT - 1) + [429]
            assert "failed from 198.51.100.9 " in beats[-1].json()["message"]
    finally:
        running.process.stop()


def test_the_client_is_the_first_address_from_the_right_that_is_not_a_trusted_proxy():
    proxies = TrustedProxies([ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("::1/128")])
    assert proxies.client("192.0.2.1", ["203.0.113.9"]) == "192.0.2.1"  # not a proxy: its own address
    assert proxies.client("10.0.0.1", ["203.0.113.9"]) == "203.0.113.9"
    assert proxies.client("10.0.0.1", ["1.1.1.1, 203.0.113.9, 10.0.0.2"]) == "203.0.113.9"
    assert proxies.client("10.0.0.1", ["1.1.1.1", "203.0.113.9"]) == "203.0.113.9"  # two headers: one list
    assert proxies.client("10.0.0.1", ["10.0.0.3, 10.0.0.2"]) == "10.0.0.3"  # every hop a proxy: leftmost
    assert proxies.client("10.0.0.1", ["unknown, 10.0.0.2"]) == "10.0.0.2"  # not an address: stop there
    assert proxies.client("::1", ["2001:db8::1"]) == "2001:db8::1"
    assert proxies.client("::ffff:10.0.0.1", ["203.0.113.9"]) == "203.0.113.9"  # a dual-stack socket's peer
    scope = {
        "type": "http",
        "scheme": "http",
        "client": ("10.0.0.1", 5000),
        "headers": [(b"x-forwarded-for", b"203.0.113.9"), (b"x-forwarded-proto", b"https")],
    }
    proxies.resolve(scope)
    assert (scope["client"], scope["scheme"]) == (("203.0.113.9", 0), "https")
    untrusted = {**scope, "client": ("192.0.2.1", 5000), "scheme": "http"}
    proxies.resolve(untrusted)
    assert (untrusted["client"], untrusted["scheme"]) == (("192.0.2.1", 5000), "http")
