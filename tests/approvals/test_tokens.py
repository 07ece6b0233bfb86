"""API tokens: expiry, revocation (API, command, admin, a password change), last use."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.cache import cache
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals import services
from approvals.models import ApiToken

from .factories import make_user, post_json, session_client

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "correct horse battery staple 7"


@pytest.fixture(autouse=True)
def _fresh_throttles():
    cache.clear()  # failed authentications below count per address
    yield
    cache.clear()


def _token(username: str, *args: str) -> str:
    out = io.StringIO()
    call_command("api_token", username, *args, stdout=out)
    return out.getvalue().strip()


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _get(token: str, path: str = "/api/requests"):
    return Client().get(path, headers=_auth(token))


def _row(token: str) -> ApiToken:
    return ApiToken.objects.get(key_hash=ApiToken.hash(token))


# -- expiry ----------------------------------------------------------------------------------


def test_a_new_token_expires_after_the_default_lifetime(settings):
    settings.TOOLNEXUS_TOKEN_DAYS = 7
    user = make_user()
    before = timezone.now()
    row = _row(_token(user.username))
    assert before + timedelta(days=7) <= row.expires_at <= timezone.now() + timedelta(days=7)


def test_the_command_sets_a_tokens_lifetime_or_none(settings):
    settings.TOOLNEXUS_TOKEN_DAYS = 90
    user = make_user()
    assert _row(_token(user.username, "--days", "0")).expires_at is None
    two = _row(_token(user.username, "--days", "2")).expires_at
    assert timedelta(days=1, hours=23) < two - timezone.now() <= timedelta(days=2)
    with pytest.raises(CommandError, match="days"):
        _token(user.username, "--days", "-1")


def test_an_expired_token_is_401_saying_so():
    user = make_user()
    token = _token(user.username)
    assert _get(token).status_code == 200
    ApiToken.objects.filter(user=user).update(expires_at=timezone.now() - timedelta(seconds=1))
    response = _get(token)
    assert response.status_code == 401
    detail = response.json()["detail"]
    assert detail.startswith("authentication failed: API token tnx_") and "expired at" in detail
    assert "create a new one" in detail
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_unknown_revoked_and_inactive_tokens_are_401_each_saying_why():
    user = make_user()
    token = _token(user.username)
    assert "not valid" in _get("tnx_made-up").json()["detail"]
    services.api_token_revoke(token_id=_row(token).pk, user=user)
    response = _get(token)
    assert response.status_code == 401
    assert "was revoked at" in response.json()["detail"]
    assert "(revoked by its owner)" in response.json()["detail"]
    other = make_user()
    live = _token(other.username)
    other.is_active = False
    other.save()
    assert "inactive" in _get(live).json()["detail"]


# -- last use --------------------------------------------------------------------------------


def test_last_used_is_written_at_most_once_a_minute():
    user = make_user()
    token = _token(user.username)
    client = Client()
    with CaptureQueriesContext(connection) as ctx:
        for _ in range(5):
            assert client.get("/api/requests", headers=_auth(token)).status_code == 200
    writes = [
        q["sql"] for q in ctx.captured_queries if q["sql"].startswith('UPDATE "approvals_apitoken"')
    ]
    assert len(writes) == 1
    first = _row(token).last_used_at
    assert first is not None
    # Two minutes on, the next request stamps it again.
    ApiToken.objects.filter(user=user).update(last_used_at=first - timedelta(minutes=2))
    client.get("/api/requests", headers=_auth(token))
    assert _row(token).last_used_at > first - timedelta(minutes=2)


# -- one's own tokens through the API ------------------------------------------------------


def test_a_user_lists_their_own_tokens_without_any_secret():
    user = make_user()
    first = _token(user.username, "--name", "ci")
    second = _token(user.username, "--name", "laptop", "--days", "0")
    _token(make_user().username, "--name", "someone else's")
    response = _get(second, "/api/tokens")
    assert response.status_code == 200
    body = response.json()
    assert body["count"] == 2
    assert [t["name"] for t in body["items"]] == ["laptop", "ci"]
    laptop, ci = body["items"]
    assert laptop["current"] is True and ci["current"] is False
    assert laptop["state"] == "active" and laptop["expires_at"] is None
    assert ci["prefix"] == first[:12] and ci["expires_at"] is not None
    text = response.content.decode()
    for secret in (first, second):
        assert secret not in text and _row(secret).key_hash not in text
    assert "key_hash" not in text
    # The browser session lists them too.
    assert session_client(user).get("/api/tokens").json()["count"] == 2


def test_the_token_list_filters_by_state():
    user = make_user()
    active = _token(user.username, "--name", "active")
    revoked = _token(user.username, "--name", "revoked")
    expired = _token(user.username, "--name", "expired")
    services.api_token_revoke(token_id=_row(revoked).pk, user=user)
    ApiToken.objects.filter(pk=_row(expired).pk).update(expires_at=timezone.now())
    for state in ("active", "revoked", "expired"):
        items = _get(active, f"/api/tokens?state={state}").json()["items"]
        assert [t["name"] for t in items] == [state]
        assert items[0]["state"] == state
    response = _get(active, "/api/tokens?state=gone")
    assert response.status_code == 400 and "state" in response.json()["detail"]


def test_a_user_revokes_their_own_token_and_only_their_own():
    user = make_user()
    keep = _token(user.username, "--name", "keep")
    drop = _token(user.username, "--name", "drop")
    mine = _row(drop)
    response = post_json(Client(), f"/api/tokens/{mine.pk}/revoke", headers=_auth(keep))
    assert response.status_code == 200
    body = response.json()
    assert body["state"] == "revoked" and body["revoked_reason"] == "revoked by its owner"
    assert _get(drop).status_code == 401
    assert _get(keep).status_code == 200
    # Again: nothing changes.
    again = post_json(Client(), f"/api/tokens/{mine.pk}/revoke", headers=_auth(keep))
    assert again.status_code == 200 and again.json()["revoked_at"] == body["revoked_at"]
    # Another user's token does not exist for this user.
    theirs = _row(_token(make_user().username))
    response = post_json(Client(), f"/api/tokens/{theirs.pk}/revoke", headers=_auth(keep))
    assert response.status_code == 404
    assert ApiToken.objects.get(pk=theirs.pk).revoked_at is None


def test_a_token_may_revoke_itself():
    user = make_user()
    token = _token(user.username)
    response = post_json(Client(), f"/api/tokens/{_row(token).pk}/revoke", headers=_auth(token))
    assert response.status_code == 200 and response.json()["current"] is True
    assert _get(token).status_code == 401


def test_token_endpoints_need_authentication():
    assert Client().get("/api/tokens").status_code == 401
    assert post_json(Client(), "/api/tokens/1/revoke").status_code == 401


# -- a password change -----------------------------------------------------------------------


def test_changing_the_password_revokes_the_users_tokens():
    user = make_user(password=PASSWORD)
    token = _token(user.username)
    other = _token(make_user().username)
    client = session_client(user)
    response = client.post(
        "/accounts/password_change/",
        {
            "old_password": PASSWORD,
            "new_password1": "a different phrase 8",
            "new_password2": "a different phrase 8",
        },
    )
    assert response.status_code == 302, response.content
    response = _get(token)
    assert response.status_code == 401
    assert "(password changed)" in response.json()["detail"]
    assert _get(other).status_code == 200  # nobody else's


def test_saving_a_user_without_a_new_password_keeps_the_tokens():
    user = make_user(password=PASSWORD)
    token = _token(user.username)
    user.first_name = "Ada"
    user.save()
    user.last_login = timezone.now()
    user.save(update_fields=["last_login"])
    user.set_password(PASSWORD)  # the same password, hashed again (as a hasher upgrade does)
    user.save()
    assert _get(token).status_code == 200
    user.set_password("another phrase 9")
    user.save(update_fields=["password"])
    assert _get(token).status_code == 401


def test_signing_in_keeps_the_tokens():
    user = make_user(password=PASSWORD)
    token = _token(user.username)
    response = Client().post("/accounts/login/", {"username": user.username, "password": PASSWORD})
    assert response.status_code == 302
    assert _get(token).status_code == 200


# -- the command -----------------------------------------------------------------------------


def _revoke(*args: str) -> str:
    out = io.StringIO()
    call_command("revoke_api_token", *args, stdout=out)
    return out.getvalue()


def test_the_command_revokes_tokens_by_prefix():
    user = make_user()
    one, two, three = (_token(user.username) for _ in range(3))
    assert _revoke(one[:12], two[:12]).strip() == "revoked 2 token(s)"
    assert _get(one).status_code == 401 and _get(two).status_code == 401
    assert _get(three).status_code == 200
    assert _row(one).revoked_reason == "revoked by an operator"
    with pytest.raises(CommandError, match="no token with prefix tnx_nothing"):
        _revoke("tnx_nothing")


def test_the_command_revokes_every_token_of_a_user_and_lists_them():
    user = make_user()
    tokens = [_token(user.username, "--name", f"t{i}") for i in range(2)]
    other = _token(make_user().username)
    listing = _revoke("--user", user.username, "--list")
    assert all(t[:12] in listing for t in tokens) and "active" in listing
    assert all(t not in listing for t in tokens)  # never a secret
    assert _revoke("--user", user.username, "--all", "--reason", "left the company").strip() == (
        "revoked 2 token(s)"
    )
    assert all(_get(t).status_code == 401 for t in tokens)
    assert "left the company" in _get(tokens[0]).json()["detail"]
    assert _get(other).status_code == 200
    with pytest.raises(CommandError, match="--all needs --user"):
        _revoke("--all")
    with pytest.raises(CommandError, match="no user named"):
        _revoke("--user", "ghost", "--all")
