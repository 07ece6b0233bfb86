"""Throttling: sign-in lockout (django-axes), API rates per token, per user and per address
for failed bearer authentication, and the cap on runs started per user per minute."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.cache import cache
from django.test import Client
from django.utils import timezone

from approvals import services
from approvals.models import Run

from .factories import bearer, make_user, post_json, session_client

pytestmark = pytest.mark.django_db(transaction=True)

LOGIN = "/accounts/login/"
PASSWORD = "correct horse battery staple 7"


@pytest.fixture(autouse=True)
def _fresh_throttles():
    """Throttle counters live in the cache, which outlives a test's database: start and end
    every test here with none."""
    cache.clear()
    yield
    cache.clear()


def sign_in(client: Client, username: str, password: str, **extra):
    return client.post(LOGIN, {"username": username, "password": password}, **extra)


# -- sign-in lockout -------------------------------------------------------------------------


def test_wrong_passwords_lock_the_username_out_even_for_the_right_password(settings):
    settings.AXES_FAILURE_LIMIT = 5
    user = make_user(password=PASSWORD)
    client = Client()
    for _ in range(4):
        response = sign_in(client, user.username, "wrong")
        assert response.status_code == 200  # the form again, saying the password did not match
        assert "did not match" in response.content.decode()
    locked = sign_in(client, user.username, "wrong")  # the fifth
    assert locked.status_code == 429
    page = locked.content.decode()
    assert "Too many failed sign-ins" in page and "5 times" in page
    assert "Try again in 15 minutes" in page
    assert locked["Retry-After"] == str(15 * 60)
    assert "<header" in page  # a page of the app, not a bare error
    # The right password no longer gets in, and nothing is signed in.
    again = sign_in(client, user.username, PASSWORD)
    assert again.status_code == 429
    assert "_auth_user_id" not in client.session
    assert client.get("/").status_code == 302


def test_thirty_wrong_passwords_then_the_right_one_is_refused():
    """The issue's own numbers, with the default settings."""
    user = make_user(password=PASSWORD)
    client = Client()
    statuses = [sign_in(client, user.username, f"guess {i}").status_code for i in range(30)]
    assert statuses[:4] == [200] * 4 and set(statuses[4:]) == {429}
    assert sign_in(client, user.username, PASSWORD).status_code == 429


def test_the_lockout_is_keyed_by_username_and_address(settings):
    settings.AXES_FAILURE_LIMIT = 3
    victim = make_user(password=PASSWORD)
    other = make_user(password=PASSWORD)
    attacker = Client(REMOTE_ADDR="203.0.113.9")
    for _ in range(3):
        sign_in(attacker, victim.username, "wrong")
    assert sign_in(attacker, victim.username, PASSWORD).status_code == 429
    # Another account from the same address, and the same account from elsewhere, still work.
    assert sign_in(Client(REMOTE_ADDR="203.0.113.9"), other.username, PASSWORD).status_code == 302
    assert sign_in(Client(REMOTE_ADDR="198.51.100.7"), victim.username, PASSWORD).status_code == 302


def test_a_forwarded_for_header_does_not_escape_the_lockout_without_a_trusted_proxy(settings):
    settings.AXES_FAILURE_LIMIT = 3
    user = make_user(password=PASSWORD)
    for i in range(3):
        sign_in(Client(), user.username, "wrong", HTTP_X_FORWARDED_FOR=f"192.0.2.{i}")
    response = sign_in(Client(), user.username, PASSWORD, HTTP_X_FORWARDED_FOR="192.0.2.200")
    assert response.status_code == 429


def test_behind_a_trusted_proxy_the_forwarded_address_is_the_clients(settings):
    settings.AXES_FAILURE_LIMIT = 3
    settings.TOOLNEXUS_TRUSTED_PROXIES = 1
    user = make_user(password=PASSWORD)
    proxy = {"REMOTE_ADDR": "10.0.0.2"}
    for _ in range(3):
        sign_in(Client(**proxy), user.username, "wrong", HTTP_X_FORWARDED_FOR="203.0.113.5")
    locked = sign_in(Client(**proxy), user.username, PASSWORD, HTTP_X_FORWARDED_FOR="203.0.113.5")
    assert locked.status_code == 429
    # Another client behind the same proxy is not locked out; a client's own extra entries
    # left of the proxy's are not believed.
    elsewhere = sign_in(
        Client(**proxy), user.username, PASSWORD, HTTP_X_FORWARDED_FOR="1.2.3.4, 198.51.100.1"
    )
    assert elsewhere.status_code == 302


def test_a_right_password_before_the_limit_starts_the_count_again(settings):
    settings.AXES_FAILURE_LIMIT = 3
    user = make_user(password=PASSWORD)
    for _ in range(2):
        sign_in(Client(), user.username, "wrong")
    assert sign_in(Client(), user.username, PASSWORD).status_code == 302
    for _ in range(2):
        assert sign_in(Client(), user.username, "wrong").status_code == 200
    assert sign_in(Client(), user.username, PASSWORD).status_code == 302


def test_the_lock_lifts_after_the_cool_off(settings):
    from axes.models import AccessAttempt

    settings.AXES_FAILURE_LIMIT = 3
    user = make_user(password=PASSWORD)
    for _ in range(3):
        sign_in(Client(), user.username, "wrong")
    assert sign_in(Client(), user.username, PASSWORD).status_code == 429
    # Twenty minutes later (the attempts moved back instead of waiting).
    AccessAttempt.objects.update(attempt_time=timezone.now() - timedelta(minutes=20))
    assert sign_in(Client(), user.username, PASSWORD).status_code == 302


def test_the_admin_sign_in_is_locked_out_too(settings):
    settings.AXES_FAILURE_LIMIT = 3
    admin = make_user(role="superuser", password=PASSWORD)
    client = Client()
    for _ in range(3):
        client.post("/admin/login/", {"username": admin.username, "password": "wrong"})
    response = client.post("/admin/login/", {"username": admin.username, "password": PASSWORD})
    assert response.status_code == 429


def test_lockout_settings_come_from_the_environment(monkeypatch):
    from toolnexus_web.settings import env_int, env_rate

    monkeypatch.setenv("TOOLNEXUS_LOGIN_FAILURE_LIMIT", "12")
    assert env_int("TOOLNEXUS_LOGIN_FAILURE_LIMIT", 5, minimum=1) == 12
    monkeypatch.setenv("TOOLNEXUS_LOGIN_FAILURE_LIMIT", "0")
    with pytest.raises(RuntimeError, match="at least 1"):
        env_int("TOOLNEXUS_LOGIN_FAILURE_LIMIT", 5, minimum=1)
    monkeypatch.setenv("TOOLNEXUS_LOGIN_FAILURE_LIMIT", "many")
    with pytest.raises(RuntimeError, match="whole number"):
        env_int("TOOLNEXUS_LOGIN_FAILURE_LIMIT", 5, minimum=1)
    monkeypatch.setenv("TOOLNEXUS_API_TOKEN_RATE", "100/m")
    assert env_rate("TOOLNEXUS_API_TOKEN_RATE", "600/min") == "100/m"
    monkeypatch.setenv("TOOLNEXUS_API_TOKEN_RATE", "0")
    assert env_rate("TOOLNEXUS_API_TOKEN_RATE", "600/min") == ""
    monkeypatch.setenv("TOOLNEXUS_API_TOKEN_RATE", "fast")
    with pytest.raises(RuntimeError, match="600/min"):
        env_rate("TOOLNEXUS_API_TOKEN_RATE", "600/min")


# -- API rates -------------------------------------------------------------------------------


def _assert_throttled(response) -> int:
    assert response.status_code == 429, response.content
    assert response["Content-Type"].startswith("application/json")
    assert response.json()["detail"].startswith(("too many", "too many failed"))
    wait = int(response["Retry-After"])
    assert 1 <= wait <= 60
    return wait


def test_requests_per_token_are_throttled_with_retry_after(settings):
    settings.TOOLNEXUS_API_TOKEN_RATE = "3/min"
    user = make_user()
    first, second = bearer(user), bearer(user)
    client = Client()
    for _ in range(3):
        assert client.get("/api/requests", headers=first).status_code == 200
    _assert_throttled(client.get("/api/requests", headers=first))
    # Per token: the user's other token still works.
    assert client.get("/api/requests", headers=second).status_code == 200


def test_requests_per_user_count_every_token_and_the_session(settings):
    settings.TOOLNEXUS_API_USER_RATE = "4/min"
    user = make_user()
    first, second = bearer(user), bearer(user)
    client = Client()
    assert client.get("/api/requests", headers=first).status_code == 200
    assert client.get("/api/requests", headers=second).status_code == 200
    assert client.get("/api/runs", headers=first).status_code == 200
    assert session_client(user).get("/api/runs").status_code == 200
    _assert_throttled(client.get("/api/requests", headers=second))
    _assert_throttled(session_client(user).get("/api/requests"))
    # Another user is not slowed down by this one.
    assert client.get("/api/requests", headers=bearer(make_user())).status_code == 200


def test_a_throttle_set_to_nothing_is_off(settings):
    settings.TOOLNEXUS_API_TOKEN_RATE = ""
    settings.TOOLNEXUS_API_USER_RATE = ""
    user = make_user()
    headers = bearer(user)
    client = Client()
    assert all(client.get("/api/runs", headers=headers).status_code == 200 for _ in range(30))


def test_bad_bearer_tokens_are_throttled_per_address():
    """The issue: 200 bad tokens were all 401 at full speed. Default: 30 a minute."""
    client = Client(REMOTE_ADDR="203.0.113.20")
    statuses = [
        client.get("/api/requests", headers={"Authorization": f"Bearer tnx_guess{i}"}).status_code
        for i in range(200)
    ]
    assert statuses[:30] == [401] * 30
    assert set(statuses[30:]) == {429}
    response = client.get("/api/requests", headers={"Authorization": "Bearer tnx_more"})
    _assert_throttled(response)
    assert "failed authentications" in response.json()["detail"]


def test_a_blocked_address_is_refused_even_with_a_good_token_and_others_are_not(settings):
    settings.TOOLNEXUS_API_AUTH_FAILURE_RATE = "3/min"
    user = make_user()
    good = bearer(user)
    guesser = Client(REMOTE_ADDR="203.0.113.30")
    for i in range(3):
        response = guesser.get("/api/requests", headers={"Authorization": f"Bearer tnx_{i}"})
        assert response.status_code == 401
    # A guess that hits must not be told apart from one that misses.
    _assert_throttled(guesser.get("/api/requests", headers=good))
    # Other addresses, and a spoofed X-Forwarded-For does not make one.
    assert Client(REMOTE_ADDR="198.51.100.30").get("/api/requests", headers=good).status_code == 200
    spoofed = guesser.get("/api/requests", headers={**good, "X-Forwarded-For": "198.51.100.99"})
    _assert_throttled(spoofed)


def test_only_failures_count_toward_the_bad_token_limit(settings):
    settings.TOOLNEXUS_API_AUTH_FAILURE_RATE = "3/min"
    headers = bearer(make_user())
    client = Client()
    assert all(client.get("/api/requests", headers=headers).status_code == 200 for _ in range(10))
    assert client.get("/api/requests", headers={"Authorization": "Bearer x"}).status_code == 401


def test_429_is_documented_for_every_endpoint():
    from approvals.api import api

    schema = api.get_openapi_schema()
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            assert 429 in operation["responses"], (method, path)
    assert "Retry-After" in schema["info"]["description"]


# -- runs per user per minute ----------------------------------------------------------------


def _start(client, headers=None):
    return post_json(
        client, "/api/runs", {"agent": "demo", "prompt": "Refund A-1 $1"}, headers=headers
    )


def test_runs_started_through_the_api_are_capped_per_user_per_minute(settings):
    settings.TOOLNEXUS_RUNS_PER_MINUTE = 3
    user = make_user()
    headers = bearer(user)
    client = Client()
    assert [_start(client, headers).status_code for _ in range(3)] == [201] * 3
    refused = _start(client, headers)
    assert refused.status_code == 429
    assert refused.json()["detail"].startswith("too many runs: you started 3 in the last minute")
    assert 1 <= int(refused["Retry-After"]) <= 60
    assert Run.objects.filter(started_by=user).count() == 3
    # Someone else may still start runs; so may this user once the minute has passed.
    assert _start(client, bearer(make_user())).status_code == 201
    Run.objects.filter(started_by=user).update(created_at=timezone.now() - timedelta(minutes=2))
    assert _start(client, headers).status_code == 201


def test_the_issues_burst_of_big_prompts_is_capped_by_default():
    user = make_user()
    headers = bearer(user)
    client = Client()
    body = {"agent": "demo", "prompt": "x" * services.MAX_PROMPT_CHARS}
    statuses = [
        post_json(client, "/api/runs", body, headers=headers).status_code for _ in range(40)
    ]
    assert statuses[:30] == [201] * 30 and set(statuses[30:]) == {429}


def test_the_start_page_says_why_a_run_was_not_started(settings):
    settings.TOOLNEXUS_RUNS_PER_MINUTE = 2
    user = make_user()
    client = session_client(user)
    form = {"agent": "demo", "prompt": "Refund A-1 $1"}
    assert [client.post("/runs/new/", form).status_code for _ in range(2)] == [302, 302]
    response = client.post("/runs/new/", form)
    assert response.status_code == 429
    page = response.content.decode()
    assert "Not started: too many runs: you started 2 in the last minute" in page
    assert "Refund A-1 $1" in page  # the prompt is kept for a retry
    assert Run.objects.filter(started_by=user).count() == 2


def test_no_cap_when_set_to_zero_and_none_for_internal_starts(settings):
    settings.TOOLNEXUS_RUNS_PER_MINUTE = 0
    user = make_user()
    headers = bearer(user)
    assert all(_start(Client(), headers).status_code == 201 for _ in range(5))
    settings.TOOLNEXUS_RUNS_PER_MINUTE = 1
    # Code that starts runs itself (not a person through a page or the API) is not capped.
    services.run_start(agent="demo", prompt="internal", started_by=user)
    assert _start(Client(), headers).status_code == 429
