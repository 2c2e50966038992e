"""The platform's error contract as schemathesis checks, shared by the in-process run in `make test`
(tests/test_api_fuzz.py) and the long run against a live server (bench/fuzz/run.py).

1. ``error_envelope``: every error answer other than the 500 is JSON with exactly the keys ``code``,
   ``message`` and ``correlation_id``, each a non-empty string.
2. ``plain_internal_server_error``: a 500 is the body ``Internal Server Error`` exactly, as
   ``text/plain``: no DSN, driver, SQL, path or traceback.
3. ``no_internal_server_error``: no input produces a 500 at all.
4. ``positive_data_acceptance_documented``: schemathesis's ``positive_data_acceptance`` (a schema-valid
   request is not refused with a 400 or 422), except for a refusal its operation documents as one for
   what is stored (the ``x-modelforge-state-refusals`` of the OpenAPI document: a taken name, a row that
   does not exist, an expiry already past): that status with that code passes; any other refusal fails,
   the same code with another status too. Runs in place of the built-in check, which is then disabled.

A check returns None when it passed and True when it does not apply: schemathesis counts only the
former as passed (a failure raises). Until 2026-12-07 these returned the two the other way round, so a
run's "passed" for them counted the answers they did not apply to. Registering them with
``@schemathesis.check`` makes them part of every run that imports this module (the CLI through
``SCHEMATHESIS_HOOKS=tests.contract_checks``)."""

from __future__ import annotations

import json

import schemathesis
from schemathesis.openapi.checks import RejectedPositiveData
from schemathesis.specs.openapi.checks import positive_data_acceptance

# modelforge.autoschema.STATE_REFUSALS: spelled here too, so that these checks import nothing of the project.
STATE_REFUSALS = "x-modelforge-state-refusals"

ENVELOPE_KEYS = frozenset({"code", "message", "correlation_id"})
INTERNAL_SERVER_ERROR = b"Internal Server Error"


def _content(response: schemathesis.Response) -> bytes:
    return response.content or b""


def _content_type(response: schemathesis.Response) -> str:
    return (response.headers.get("content-type") or [""])[0]


@schemathesis.check
def error_envelope(
    ctx: schemathesis.CheckContext, response: schemathesis.Response, case: schemathesis.Case
) -> bool | None:
    """An error answer (4xx, or a 5xx other than the plain 500) is exactly the envelope."""
    if response.status_code < 400 or response.status_code == 500:
        return True  # not an error answer: skipped, not counted as passed
    if not _content_type(response).startswith("application/json"):
        raise AssertionError(f"{response.status_code} is not JSON: {_content_type(response)!r}")
    try:
        body = json.loads(_content(response))
    except ValueError as exc:
        raise AssertionError(
            f"{response.status_code} body is not JSON: {_content(response)[:200]!r}"
        ) from exc
    if not isinstance(body, dict) or set(body) != ENVELOPE_KEYS:
        keys = sorted(body) if isinstance(body, dict) else type(body).__name__
        raise AssertionError(f"{response.status_code} body is not the envelope: keys {keys}")
    empty = [key for key in sorted(ENVELOPE_KEYS) if not isinstance(body[key], str) or not body[key]]
    if empty:
        raise AssertionError(f"{response.status_code} envelope has empty or non-string {empty}")
    return None


@schemathesis.check
def plain_internal_server_error(
    ctx: schemathesis.CheckContext, response: schemathesis.Response, case: schemathesis.Case
) -> bool | None:
    """A 500 says nothing but ``Internal Server Error``, as text/plain."""
    if response.status_code != 500:
        return True  # skipped
    if _content(response) != INTERNAL_SERVER_ERROR:
        raise AssertionError(f"500 body is not exactly 'Internal Server Error': {_content(response)[:200]!r}")
    if not _content_type(response).startswith("text/plain"):
        raise AssertionError(f"500 is not text/plain: {_content_type(response)!r}")
    return None


@schemathesis.check
def no_internal_server_error(
    ctx: schemathesis.CheckContext, response: schemathesis.Response, case: schemathesis.Case
) -> bool | None:
    """No input produces a 500."""
    if response.status_code == 500:
        raise AssertionError(f"500 Internal Server Error for {case.method} {case.formatted_path}")
    return None


def documented_state_refusal(case: schemathesis.Case, response: schemathesis.Response) -> str | None:
    """The code of ``response`` when its operation documents it, with this status, as a refusal for what
    is stored; else None."""
    documented = (case.operation.definition.raw or {}).get(STATE_REFUSALS) or {}
    try:
        code = json.loads(_content(response)).get("code")
    except (ValueError, AttributeError):
        return None
    if isinstance(code, str) and str(documented.get(code)) == str(response.status_code):
        return code
    return None


@schemathesis.check
def positive_data_acceptance_documented(
    ctx: schemathesis.CheckContext, response: schemathesis.Response, case: schemathesis.Case
) -> bool | None:
    """A schema-valid request is accepted, or refused for a reason its operation documents."""
    try:
        return positive_data_acceptance(ctx, response, case)
    except RejectedPositiveData:
        if documented_state_refusal(case, response) is not None:
            return None  # passed
        raise


CONTRACT_CHECKS = (error_envelope, plain_internal_server_error, no_internal_server_error)
