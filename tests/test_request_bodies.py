"""Request bodies on Django's endpoints (issue 47, item 3): refused by their declared length before they
are read, bounded as they arrive when chunked, and a chunked body parsed like any other. Over real HTTP to
a real gunicorn + uvicorn web process: Django's own handler, which is where the body used to be spooled
whole, runs only there."""

from __future__ import annotations

import contextlib
import json
import os
import socket

import psutil
import pytest
from django.conf import settings

from apps.clusters.models import Capability
from tests.test_bounded_input import ENVELOPE_KEYS, envelope_of

MIB = 2**20
# Django endpoints, one unauthenticated (enroll), one an operator's, one a dashboard form.
DJANGO_POSTS = ["/api/v1/agent/enroll", "/api/v1/capabilities", "/login/"]


def open_connection(url: str) -> tuple[socket.socket, str]:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=15), host


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes; a socket timeout (15 s) fails the test."""
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    return answer


@pytest.mark.django_db(transaction=True)
@pytest.mark.stack
@pytest.mark.parametrize("path", DJANGO_POSTS)
def test_a_declared_300_mib_body_without_a_credential_is_refused_before_it_is_sent(live_web, path):
    # Regression: the 413 came only after all 300 MiB had arrived (Django spooled the body first).
    sock, host = open_connection(live_web.url)
    with sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {300 * MIB}\r\n\r\n".encode()
        )  # the headers only: the answer must come without a byte of the body
        status, headers, body = envelope_of(read_until_closed(sock))
    assert (status, body["code"]) == (413, "PAYLOAD_TOO_LARGE"), body
    assert set(body) == ENVELOPE_KEYS
    assert headers["connection"] == "close"
    assert str(settings.DATA_UPLOAD_MAX_MEMORY_SIZE) in body["message"]


def worker_pids(master: int) -> list[int]:
    return [child.pid for child in psutil.Process(master).children(recursive=True)]


def largest_open_file(pids: list[int]) -> int:
    """The size of the largest regular file the processes hold open (a spooled body is an unlinked temp file
    that only its descriptor still names)."""
    largest = 0
    for pid in pids:
        for name in os.listdir(f"/proc/{pid}/fd"):
            try:
                stat = os.stat(f"/proc/{pid}/fd/{name}")
            except OSError:
                continue
            if (stat.st_mode & 0o170000) == 0o100000:
                largest = max(largest, stat.st_size)
    return largest


@pytest.mark.django_db(transaction=True)
@pytest.mark.stack
def test_a_chunked_body_past_the_limit_is_refused_without_spooling_it(live_web):
    # Regression: a 1 GiB chunked POST to enroll grew a worker's temp file to 1,024 MiB.
    pids = worker_pids(live_web.process.process.pid)
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    sock, host = open_connection(live_web.url)
    largest = 0
    answer = b""
    with sock:
        sock.sendall(
            f"POST /api/v1/agent/enroll HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n".encode()
        )
        block = b"[" * (256 * 1024)
        piece = f"{len(block):x}\r\n".encode() + block + b"\r\n"
        try:
            for sent in range(1, 64 * 4 + 1):  # up to 64 MiB, watching the worker as it goes
                sock.sendall(piece)
                if sent % 8 == 0:
                    largest = max(largest, largest_open_file(pids))
            sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused and closed mid-body: what a body past the drain bound gets
        with contextlib.suppress(ConnectionResetError):
            answer = read_until_closed(sock)
    largest = max(largest, largest_open_file(pids))
    assert largest <= limit, f"a worker holds a {largest}-byte file open"
    if answer:  # the answer, when the reset did not swallow it
        status, _, body = envelope_of(answer)
        assert (status, body["code"]) == (413, "PAYLOAD_TOO_LARGE"), body


def send_chunked(url: str, path: str, body: bytes, headers: dict[str, str], pieces: int = 3) -> bytes:
    sock, host = open_connection(url)
    head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers.items()) + "\r\n"
    size = -(-len(body) // pieces)
    with sock:
        sock.sendall(head.encode())
        for at in range(0, len(body), size):
            part = body[at : at + size]
            sock.sendall(f"{len(part):x}\r\n".encode() + part + b"\r\n")
        sock.sendall(b"0\r\n\r\n")
        return read_until_closed(sock)


OPERATOR = {"Content-Type": "application/json", "Authorization": f"Bearer {settings.OPERATOR_API_KEY}"}


@pytest.mark.django_db(transaction=True)
@pytest.mark.stack
def test_a_chunked_json_body_is_parsed_like_any_other(live_web):
    # Regression: Django ignores a body without Content-Length: "name: This field is required".
    body = json.dumps({"name": "chunked.test@1", "description": "sent in pieces"}).encode()
    status, _, answer = envelope_of(send_chunked(live_web.url, "/api/v1/capabilities", body, OPERATOR))
    assert status == 201, answer
    assert answer["name"] == "chunked.test@1"
    assert Capability.objects.get(name="chunked.test@1").description == "sent in pieces"


@pytest.mark.django_db(transaction=True)
@pytest.mark.stack
def test_a_chunked_body_just_under_the_limit_is_taken_and_one_byte_more_is_413(live_web):
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    name = json.dumps({"name": "edge.test@1", "description": ""}).encode()
    fits = name[:-2] + b" " * (limit - len(name)) + name[-2:]
    assert len(fits) == limit
    status, _, answer = envelope_of(send_chunked(live_web.url, "/api/v1/capabilities", fits, OPERATOR, 7))
    # The body reaches the serializer whole (its own rules judge the padded description).
    assert status in (201, 400), answer
    assert answer.get("code") != "PAYLOAD_TOO_LARGE"
    over = fits[:-1] + b" }"
    status, _, answer = envelope_of(send_chunked(live_web.url, "/api/v1/capabilities", over, OPERATOR, 7))
    assert (status, answer["code"]) == (413, "PAYLOAD_TOO_LARGE"), answer


@pytest.mark.django_db(transaction=True)
@pytest.mark.stack
def test_a_body_within_the_limit_still_reaches_django_by_its_declared_length(live_web):
    import httpx

    response = httpx.post(
        live_web.url + "/api/v1/capabilities", json={"name": "plain.test@1"}, headers=OPERATOR
    )
    assert response.status_code == 201, response.text


@pytest.mark.django_db(transaction=True)
@pytest.mark.stack
def test_a_chunked_body_without_the_field_is_judged_by_the_serializer(live_web):
    status, _, body = envelope_of(send_chunked(live_web.url, "/api/v1/capabilities", b"{}", OPERATOR))
    assert (status, body["code"]) == (400, "VALIDATION_ERROR"), body
    assert "name" in body["message"]
