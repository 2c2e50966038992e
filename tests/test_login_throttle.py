"""Log-in throttling (django-axes): failed passwords lock a username from an address for a cool-off; while
locked even the right password is refused unchecked, and the page says what happened and until when."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

pytestmark = pytest.mark.django_db

PASSWORD = "correct-horse-battery-9"


@pytest.fixture
def operator() -> User:
    return User.objects.create_superuser("ops", email="", password=PASSWORD)


def log_in(client: Client, password: str, username: str = "ops", path: str = "/login/", **extra):
    return client.post(path, {"username": username, "password": password}, **extra)


def logged_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def test_the_defaults_are_five_failures_and_fifteen_minutes():
    assert settings.LOGIN_FAILURE_LIMIT == 5
    assert settings.LOGIN_COOLOFF == 900
    assert settings.AXES_FAILURE_LIMIT == 5
    assert settings.AXES_COOLOFF_TIME.total_seconds() == 900


def test_thirty_wrong_passwords_lock_the_login_at_the_limit_and_the_rest_are_not_checked(operator):
    # Regression (issue 13, finding 7): 30 wrong passwords in 14 s were all checked.
    client = Client()
    pages = [log_in(client, f"wrong-{i}").content.decode() for i in range(30)]
    for page in pages[: settings.LOGIN_FAILURE_LIMIT - 1]:
        assert "LOGIN_LOCKED_OUT" not in page
        assert "Please enter a correct username and password" in page
    for page in pages[settings.LOGIN_FAILURE_LIMIT - 1 :]:
        assert "LOGIN_LOCKED_OUT" in page
    # Only the failures up to the limit were checked and counted; the other 25 never reached a password.
    attempt = AccessAttempt.objects.get(username="ops", ip_address="127.0.0.1")
    assert attempt.failures_since_start == settings.LOGIN_FAILURE_LIMIT


def test_the_right_password_is_refused_while_locked_and_accepted_after_the_cool_off(operator):
    client = Client()
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        for i in range(settings.LOGIN_FAILURE_LIMIT):
            log_in(client, f"wrong-{i}")
    with time_machine.travel(start + timedelta(seconds=settings.LOGIN_COOLOFF - 1), tick=False):
        response = log_in(client, PASSWORD)
        assert response.status_code == 200
        assert "LOGIN_LOCKED_OUT" in response.content.decode()
        assert not logged_in(client)
    with time_machine.travel(start + timedelta(seconds=settings.LOGIN_COOLOFF + 1), tick=False):
        response = log_in(client, PASSWORD)
        assert response.status_code == 302
        assert logged_in(client)


def test_refused_attempts_while_locked_do_not_move_the_time_the_page_gave(operator):
    client = Client()
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        for i in range(settings.LOGIN_FAILURE_LIMIT):
            log_in(client, f"wrong-{i}")
    with time_machine.travel(start + timedelta(seconds=600), tick=False):
        log_in(client, "wrong-again")
    with time_machine.travel(start + timedelta(seconds=settings.LOGIN_COOLOFF + 1), tick=False):
        assert log_in(client, PASSWORD).status_code == 302


def test_the_lockout_page_says_what_happened_and_when_to_try_again(operator):
    client = Client()
    start = timezone.now().replace(microsecond=0)
    with time_machine.travel(start, tick=False):
        for i in range(settings.LOGIN_FAILURE_LIMIT):
            response = log_in(client, f"wrong-{i}")
    page = response.content.decode()
    until = start + timedelta(seconds=settings.LOGIN_COOLOFF)
    assert response.status_code == 200  # a page explaining a refusal, as every dashboard refusal is
    assert "<code>LOGIN_LOCKED_OUT</code>" in page
    assert "ops" in page and "127.0.0.1" in page
    assert f"{settings.LOGIN_FAILURE_LIMIT} failed log-ins" in page
    assert until.strftime("%H:%M:%S UTC") in page
    assert "even with the right password" in page
    assert "Access attempts" in page  # where another operator clears it
    assert 'href="/login/"' in page


def test_another_address_can_still_log_in_to_a_locked_username(operator):
    locked = Client()
    for i in range(settings.LOGIN_FAILURE_LIMIT):
        log_in(locked, f"wrong-{i}")
    elsewhere = Client(REMOTE_ADDR="10.20.30.40")
    assert log_in(elsewhere, PASSWORD).status_code == 302
    assert logged_in(elsewhere)


def test_another_username_from_the_same_address_is_not_locked(operator):
    User.objects.create_superuser("ops2", email="", password=PASSWORD)
    client = Client()
    for i in range(settings.LOGIN_FAILURE_LIMIT):
        log_in(client, f"wrong-{i}")
    assert log_in(client, PASSWORD, username="ops2").status_code == 302


def test_a_successful_log_in_below_the_limit_is_not_locked_later_by_old_failures(operator):
    client = Client()
    for i in range(settings.LOGIN_FAILURE_LIMIT - 1):
        log_in(client, f"wrong-{i}")
    assert log_in(client, PASSWORD).status_code == 302
    client.post("/logout/")
    # Success resets the count: one more typo is not the limit.
    assert "LOGIN_LOCKED_OUT" not in log_in(client, "wrong-again").content.decode()


def test_the_admin_log_in_is_locked_too_and_the_admin_lists_the_attempts(operator):
    client = Client()
    for i in range(settings.LOGIN_FAILURE_LIMIT):
        response = log_in(client, f"wrong-{i}", path="/admin/login/")
    page = response.content.decode()
    assert "LOGIN_LOCKED_OUT" in page and 'href="/admin/login/"' in page
    assert log_in(client, PASSWORD, path="/admin/login/").status_code == 200
    assert not logged_in(client)

    admin = Client(REMOTE_ADDR="10.9.8.7")
    admin.force_login(operator)
    listing = admin.get("/admin/axes/accessattempt/")
    assert listing.status_code == 200
    assert "127.0.0.1" in listing.content.decode()
    assert "/admin/login/" in listing.content.decode()
