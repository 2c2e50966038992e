"""The error envelope: exactly {code, message, correlation_id}; a 500 is exactly 'Internal Server Error'."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request

import pytest
from django.test import Client

from modelforge.logging import CorrelationIdFilter

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.urls_errors")]

ENVELOPE_KEYS = {"code", "message", "correlation_id"}


def assert_envelope(response, status: int, code: str) -> dict[str, str]:
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/json")
    body = json.loads(response.content)
    assert set(body) == ENVELOPE_KEYS, body
    assert body["code"] == code
    assert body["message"]
    assert body["correlation_id"] == response["X-Correlation-ID"]
    return body


@pytest.mark.parametrize("debug", [False, True])
def test_an_unknown_address_is_a_404_envelope(client: Client, settings, debug):
    settings.DEBUG = debug
    assert_envelope(client.get("/api/v1/no/such/endpoint"), 404, "NOT_FOUND")
    assert_envelope(client.get("/v1/no/such/endpoint"), 404, "NOT_FOUND")


@pytest.mark.parametrize("debug", [False, True])
def test_an_unknown_dashboard_address_is_an_html_404_page_in_the_layout(client: Client, settings, debug):
    # Regression: unknown dashboard URLs answered the raw JSON envelope to a person's browser.
    settings.DEBUG = debug
    response = client.get("/no/such/page", HTTP_X_CORRELATION_ID="corr-page-404")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")
    body = response.content.decode()
    assert "Page not found" in body and "/no/such/page" in body and "corr-page-404" in body
    assert 'class="topbar"' in body  # the dashboard's layout, not a bare page


def test_a_wrong_method_is_a_405_envelope_with_allow(client: Client, operator_client):
    response = client.post("/healthz")
    assert_envelope(response, 405, "METHOD_NOT_ALLOWED")
    assert "GET" in response["Allow"]
    api = operator_client.delete("/api/v1/system/status")
    assert_envelope(api, 405, "METHOD_NOT_ALLOWED")
    assert "GET" in api["Allow"]


def test_the_api_without_credentials_is_a_401_envelope(anonymous_client):
    response = anonymous_client.get("/api/v1/system/status")
    assert_envelope(response, 401, "NOT_AUTHENTICATED")
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_invalid_input_is_a_400_envelope_naming_the_fields(operator_client):
    response = operator_client.post(
        "/api/v1/test/echo", {"name": "far too long a name", "count": -1}, format="json"
    )
    body = assert_envelope(response, 400, "VALIDATION_ERROR")
    assert "name:" in body["message"]
    assert "count:" in body["message"]


def test_malformed_json_is_a_400_envelope(operator_client):
    response = operator_client.post("/api/v1/test/echo", "{not json", content_type="application/json")
    assert_envelope(response, 400, "MALFORMED_REQUEST")


def test_a_wrong_media_type_is_a_415_envelope(operator_client):
    response = operator_client.post(
        "/api/v1/test/echo", "name=x", content_type="application/x-www-form-urlencoded"
    )
    assert_envelope(response, 415, "UNSUPPORTED_MEDIA_TYPE")


def test_a_plain_django_400_is_an_envelope(client: Client, settings):
    settings.DEBUG = True
    assert_envelope(client.get("/healthz", HTTP_HOST="evil.example.com"), 400, "BAD_REQUEST")


def test_a_body_over_the_limit_is_a_413_envelope(operator_client, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2048
    response = operator_client.post("/api/v1/test/echo", {"name": "x" * 5000, "count": 1}, format="json")
    assert_envelope(response, 413, "PAYLOAD_TOO_LARGE")


def test_a_csrf_failure_is_a_403_envelope(settings):
    client = Client(enforce_csrf_checks=True)
    assert_envelope(client.post("/login/", {"username": "a", "password": "b"}), 403, "CSRF_FAILED")


def test_a_named_refusal_keeps_its_code_and_status(client: Client):
    body = assert_envelope(client.get("/test/refuse"), 409, "SOMETHING_REFUSED")
    assert body["message"] == "Refused on purpose; do the next step."


@pytest.mark.parametrize("debug", [False, True])
@pytest.mark.parametrize("path", ["/test/explode", "/api/v1/test/explode"])
def test_an_exception_is_exactly_internal_server_error(
    client: Client, operator_client, settings, debug, path, caplog
):
    settings.DEBUG = debug
    caplog.handler.addFilter(CorrelationIdFilter())
    chosen = operator_client if path.startswith("/api/") else client
    response = chosen.get(path, HTTP_X_CORRELATION_ID="corr-explode-0001")
    assert response.status_code == 500
    if path.startswith("/api/"):
        assert response["Content-Type"] == "text/plain"
        assert response.content == b"Internal Server Error"
    else:  # a dashboard address: the HTML page in the layout, still without the exception's text
        body = response.content.decode()
        assert response["Content-Type"].startswith("text/html")
        assert "Something went wrong" in body and "corr-explode-0001" in body
        assert "hunter2" not in body and "RuntimeError" not in body
    assert response["X-Correlation-ID"] == "corr-explode-0001"
    # The full story is in the log, under the same correlation id.
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR and r.name == "modelforge.errors"]
    assert errors and errors[0].correlation_id == "corr-explode-0001"  # type: ignore[attr-defined]
    assert errors[0].exc_info is not None


def test_a_well_formed_correlation_id_is_echoed_and_a_bad_one_replaced(client: Client):
    kept = client.get("/api/v1/no/such/page", HTTP_X_CORRELATION_ID="abc-123-DEF-456")
    assert kept["X-Correlation-ID"] == "abc-123-DEF-456"
    assert json.loads(kept.content)["correlation_id"] == "abc-123-DEF-456"
    replaced = client.get("/api/v1/no/such/page", HTTP_X_CORRELATION_ID="bad id\nwith newline")
    assert replaced["X-Correlation-ID"] != "bad id\nwith newline"
    assert len(replaced["X-Correlation-ID"]) == 32
    assert client.get("/healthz")["X-Correlation-ID"]


@pytest.mark.stack
def test_through_gunicorn_the_correlation_id_is_in_header_body_and_log(live_web):
    request = urllib.request.Request(
        live_web.url + "/api/v1/nowhere", headers={"X-Correlation-ID": "live-corr-98765"}
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=5)
    error = caught.value
    assert error.code == 404
    assert error.headers["X-Correlation-ID"] == "live-corr-98765"
    assert json.loads(error.read()) == {
        "code": "NOT_FOUND",
        "message": "Nothing exists at this address.",
        "correlation_id": "live-corr-98765",
    }
    log_lines = [line for line in live_web.process.log().splitlines() if "live-corr-98765" in line]
    assert any("GET /api/v1/nowhere -> 404" in line for line in log_lines), live_web.process.log()[-2000:]
