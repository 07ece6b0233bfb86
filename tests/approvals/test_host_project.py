"""The app in a project that is not this repository's demo: settings with defaults, system
checks that name what is missing, the URLs at any prefix (pages, API, sockets), the app's
own page frame, error answers and 403 page, serve's opt-ins, the groups command."""

from __future__ import annotations

import io
import json
from datetime import timedelta
from pathlib import Path

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import global_settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.staticfiles import finders
from django.core.checks.urls import check_url_namespaces_unique
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from approvals import agents, checks, conf, permissions, services
from approvals.agents.discovery import autodiscover
from approvals.conf import app_settings
from approvals.live import routing
from approvals.management.commands import serve
from approvals.models import ApprovalRequest

from .factories import make_user, post_json, session_client, start_and_halt
from .test_security_defaults import _manage

HOST_URLS = "tests.approvals.host_urls"
WITHOUT_TASKS_DB = "tests.approvals.settings_without_tasks_db"
FRESH_URLS = "tests.approvals.fresh_urls"  # startproject's URLconf plus the README's lines
NO_SIGN_IN_URLS = "tests.approvals.no_sign_in_urls"
HOST_TEMPLATES = Path(__file__).parent / "host_templates"


def _ids(messages) -> list[str]:
    return [m.id for m in messages]


# -- settings: one namespace, with defaults --------------------------------------------------


def test_every_setting_has_a_default_when_the_project_sets_none(settings):
    for name in conf.DEFAULTS:
        delattr(settings, conf.setting_name(name))
    assert app_settings.RUN_LEASE_SECONDS == 30
    assert app_settings.TOKEN_DAYS == 90
    assert app_settings.DEMO_AGENT is False and app_settings.DEMO_ACCOUNTS is False
    assert app_settings.BASE_TEMPLATE == "approvals/page.html"
    settings.TOOLNEXUS_TOKEN_DAYS = 7  # a project's own value wins, read on every access
    assert app_settings.TOKEN_DAYS == 7
    with pytest.raises(AttributeError, match="TOOLNEXUS_NO_SUCH"):
        app_settings.NO_SUCH  # noqa: B018


@pytest.mark.django_db
def test_the_app_works_without_any_toolnexus_setting(settings):
    """A project that sets none of them: the app reads its settings with defaults, and the
    app's ready() gives the modules that still read settings.TOOLNEXUS_* (the worker) theirs.
    Before, the run failed with AttributeError."""
    for name in conf.DEFAULTS:
        delattr(settings, conf.setting_name(name))
    conf.install_defaults()  # what ready() does in such a project
    user = make_user()
    run = start_and_halt(user=user)
    assert run.status == "pending"
    assert run.requests.get().expires_at is None  # REQUEST_TTL_SECONDS: 0, never
    _, token = services.api_token_create(user=user)
    assert timezone.now() + timedelta(days=89) < token.expires_at  # TOKEN_DAYS: 90


def test_install_defaults_fills_in_what_the_project_left_out(settings):
    """For the modules that still read settings.TOOLNEXUS_* directly (the worker, the
    consumers, serve's server options)."""
    del settings.TOOLNEXUS_RUN_LEASE_SECONDS
    del settings.TOOLNEXUS_MAX_SOCKETS_PER_USER
    settings.TOOLNEXUS_WORKER_INTERVAL = 1.5
    filled = conf.install_defaults()
    assert "TOOLNEXUS_RUN_LEASE_SECONDS" in filled and "TOOLNEXUS_MAX_SOCKETS_PER_USER" in filled
    assert settings.TOOLNEXUS_RUN_LEASE_SECONDS == 30
    assert settings.TOOLNEXUS_MAX_SOCKETS_PER_USER == 30
    assert settings.TOOLNEXUS_WORKER_INTERVAL == 1.5  # the project's own value stays


def test_the_demo_agent_is_opt_in(settings):
    demo = agents.get("demo")
    agents.unregister("demo")
    try:
        del settings.TOOLNEXUS_DEMO_AGENT
        autodiscover()
        assert agents.get("demo") is None  # a host project gets no uninvited agent
        settings.TOOLNEXUS_DEMO_AGENT = True
        autodiscover()
        assert agents.get("demo") is not None
    finally:
        agents.unregister("demo")
        agents.register(demo.name, **_registration(demo))


def _registration(agent) -> dict:
    return {
        "model": agent.model,
        "tools": agent.tools,
        "executors": agent.executors,
        "system_prompt": agent.system_prompt,
        "description": agent.description,
        "allow_typed_output": agent.allow_typed_output,
    }


# -- system checks -------------------------------------------------------------------------


def test_the_demo_project_passes_every_check():
    assert list(checks.run_all()) == []


def test_check_e001_htmx_middleware(settings):
    settings.MIDDLEWARE = [
        m for m in settings.MIDDLEWARE if m != "django_htmx.middleware.HtmxMiddleware"
    ]
    (error,) = checks.check_middleware()
    assert error.id == "approvals.E001"
    assert "request.htmx" in error.msg and "django_htmx.middleware.HtmxMiddleware" in error.hint


@pytest.mark.parametrize(
    "tasks",
    [
        None,
        {"default": {"BACKEND": "django_tasks.backends.immediate.ImmediateBackend"}},
        {"default": {"BACKEND": "no.such.Backend"}},
    ],
)
def test_check_e002_task_backend(settings, tasks):
    if tasks is None:
        del settings.TASKS
    else:
        settings.TASKS = tasks
    (error,) = checks.check_task_backend()
    assert error.id == "approvals.E002"
    assert (
        'TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend",'
        ' "QUEUES": ["default", "webhooks"]}}' in error.hint
    )
    assert "ImmediateBackend" in error.msg if tasks and "immediate" in str(tasks) else True


def test_check_e002_accepts_django_tasks_db(settings):
    settings.TASKS = {
        "default": {
            "BACKEND": "django_tasks_db.backend.DatabaseBackend",
            "QUEUES": ["default", "webhooks"],
        }
    }
    assert checks.check_task_backend() == []


def test_check_e003_required_apps(settings):
    settings.INSTALLED_APPS = [
        a for a in settings.INSTALLED_APPS if a not in ("template_partials", "django_htmx")
    ]
    errors = checks.check_installed_apps()
    assert _ids(errors) == ["approvals.E003", "approvals.E003"]
    assert {e.hint for e in errors} == {
        'Add "django_htmx" to INSTALLED_APPS.',
        'Add "template_partials" to INSTALLED_APPS.',
    }


def test_check_e003_without_django_tasks_db_is_said_not_a_traceback(tmp_path):
    """A project that adds the app but forgets django_tasks_db. Django's setup imported the
    app's admin and services, which imported django-tasks-db's model: a RuntimeError before
    any check ran."""
    done = _manage(tmp_path, "check", DJANGO_SETTINGS_MODULE=WITHOUT_TASKS_DB)
    out = done.stdout + done.stderr
    assert "Traceback" not in out, out
    assert done.returncode != 0
    assert '(approvals.E003) "django_tasks_db" is not in INSTALLED_APPS' in out, out


def test_check_e004_channel_layer(settings):
    del settings.CHANNEL_LAYERS
    (error,) = checks.check_channel_layer()
    assert error.id == "approvals.E004" and "InMemoryChannelLayer" in error.hint


def test_check_e005_app_order(settings):
    apps = [a for a in settings.INSTALLED_APPS if a != "approvals"]
    settings.INSTALLED_APPS = [*apps, "approvals"]  # after django_tasks_db
    (error,) = checks.check_app_order()
    assert error.id == "approvals.E005"
    assert "db_worker" in error.msg and "above" in error.hint
    settings.INSTALLED_APPS = ["approvals.apps.ApprovalsConfig", *apps]
    assert checks.check_app_order() == []


def test_check_e006_urls(settings):
    settings.ROOT_URLCONF = "tests.approvals.no_app_urls"
    (error,) = checks.check_urls()
    assert error.id == "approvals.E006" and 'include("approvals.urls")' in error.hint


@pytest.mark.parametrize(
    ("urls", "login_url", "said"),
    [
        # startproject + the app: Django's default LOGIN_URL leads to a 404.
        (NO_SIGN_IN_URLS, "/accounts/login/", "signed-out reviewers would be sent to a 404"),
        (NO_SIGN_IN_URLS, "login", "names no URL"),
        (NO_SIGN_IN_URLS, "/admin/login/", "refuses every account that is not staff"),
        (FRESH_URLS, "/accounts/login/?from=inbox", None),  # the app's sign-in page
        (FRESH_URLS, "login", None),
        (NO_SIGN_IN_URLS, "https://sso.example/login", None),  # served elsewhere
    ],
)
def test_check_w001_login_url(settings, urls, login_url, said):
    settings.ROOT_URLCONF = urls
    settings.LOGIN_URL = login_url
    found = checks.check_login_url()
    if said is None:
        assert found == []
    else:
        (warning,) = found
        assert warning.id == "approvals.W001" and said in warning.msg
        assert 'include("approvals.auth_urls")' in warning.hint


def test_check_w002_no_allowed_hosts_with_debug_off(settings):
    settings.DEBUG = False
    settings.ALLOWED_HOSTS = []
    (warning,) = checks.check_allowed_hosts()
    assert warning.id == "approvals.W002" and "live page's socket" in warning.msg
    settings.DEBUG = True  # startproject's settings: Django's loopback fallback, no warning
    assert checks.check_allowed_hosts() == []
    settings.DEBUG = False
    settings.ALLOWED_HOSTS = ["shop.example"]
    assert checks.check_allowed_hosts() == []


def test_check_e008_a_database_without_returning(monkeypatch):
    assert checks.check_databases() == []  # the databases the suite runs on have it
    if connection.vendor == "sqlite":  # an SQLite before 3.35
        monkeypatch.setattr(connection.features, "can_return_columns_from_insert", False)
    else:  # a database without UPDATE ... RETURNING
        monkeypatch.setattr(connection, "vendor", "mysql")
    (error,) = checks.check_databases()
    assert error.id == "approvals.E008" and "RETURNING" in error.msg
    assert "SQLite 3.35" in error.hint


def test_the_checks_run_with_manage_py_check(settings):
    settings.MIDDLEWARE = [
        m for m in settings.MIDDLEWARE if m != "django_htmx.middleware.HtmxMiddleware"
    ]
    with pytest.raises(SystemCheckError, match=r"approvals\.E001"):
        call_command("check", stderr=io.StringIO())


# -- the URLs at any prefix ----------------------------------------------------------------

pytest_host = pytest.mark.urls(HOST_URLS)


@pytest_host
def test_the_api_namespace_does_not_collide_with_a_projects_own_api():
    assert check_url_namespaces_unique(None) == []
    assert reverse("api:index") == "/api/"  # the project's
    assert reverse("approvals:toolnexus_api:api-root") == "/inbox/api/"


@pytest_host
@pytest.mark.django_db
def test_pages_and_socket_urls_follow_the_mount():
    page = session_client(make_user()).get("/inbox/").content.decode()
    assert 'ws-connect="/inbox/ws/inbox/?' in page
    assert 'data-app-root="/inbox/"' in page
    assert "/static/approvals/app.css" in page and "/static/approvals/app.js" in page
    assert 'href="/admin/' not in page  # no admin in this project: no link to it
    run = start_and_halt()
    page = session_client(make_user()).get(f"/inbox/runs/{run.pk}/").content.decode()
    assert f'ws-connect="/inbox/ws/runs/{run.pk}/"' in page


@pytest_host
@pytest.mark.django_db
def test_the_api_answers_json_under_its_mount(settings):
    user = make_user()
    client = session_client(user)
    assert client.get("/inbox/api/runs").status_code == 200
    missing = client.get("/inbox/api/no/such/endpoint")
    assert missing.status_code == 404 and missing.json()["detail"].startswith("Not Found")
    assert client.get("/api/").content == b"the shop's own API"
    run = start_and_halt(user=user)
    request = run.requests.get()
    url = f"/inbox/api/requests/{request.request_id}/decline"
    body = json.dumps({"reason": "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)})
    # With the request guards (this project's middleware) and without them: JSON either way.
    for middleware in (
        settings.MIDDLEWARE,
        [m for m in settings.MIDDLEWARE if "RequestGuardMiddleware" not in m],
    ):
        settings.MIDDLEWARE = middleware
        too_big = post_json(client, url, raw=body)
        assert too_big.status_code == 413, middleware
        assert too_big["Content-Type"].startswith("application/json")
        assert too_big.json() == {"detail": "request body too large"}
    request.refresh_from_db()
    assert request.state == ApprovalRequest.State.PENDING


@pytest_host
@pytest.mark.django_db
def test_a_refusal_is_the_apps_own_403_page_without_a_project_handler():
    page = session_client(make_user(role="watcher")).get("/inbox/runs/new/")
    assert page.status_code == 403
    text = page.content.decode()
    assert f"({permissions.START_PERMISSION})" in text and "Ask an administrator" in text
    assert 'class="approvals-app"' in text  # a page of the app, not Django's bare 403


@pytest_host
@pytest.mark.django_db
def test_a_signed_out_htmx_request_gets_401_without_the_guard_middleware(settings):
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if "RequestGuardMiddleware" not in m]
    response = Client().post("/inbox/requests/nope/decline/", headers={"HX-Request": "true"})
    assert response.status_code == 401
    assert "signed out" in response.content.decode()


@pytest_host
def test_websocket_routes_follow_the_mount():
    assert routing.mount() == "inbox/"
    routes = [str(p.pattern) for p in routing.websocket_urlpatterns_for()]
    assert routes == ["inbox/ws/inbox/", "inbox/ws/runs/<int:run_id>/"]
    from approvals.live.routing import websocket_urlpatterns

    assert [str(p.pattern) for p in websocket_urlpatterns] == routes


def test_websocket_routes_say_when_the_urls_are_not_included(settings):
    from django.core.exceptions import ImproperlyConfigured

    settings.ROOT_URLCONF = "tests.approvals.no_app_urls"
    with pytest.raises(ImproperlyConfigured, match=r'include\("approvals.urls"\)'):
        routing.websocket_urlpatterns_for()


@pytest_host
@pytest.mark.django_db(transaction=True)
async def test_a_live_page_connects_under_the_mount(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    reviewer = await database_sync_to_async(make_user)()

    def cookie() -> str:
        client = Client()
        client.force_login(reviewer)
        return client.cookies["sessionid"].value

    session = await database_sync_to_async(cookie)()
    headers = [
        (b"origin", b"http://testserver"),
        (b"host", b"testserver"),
        (b"cookie", f"sessionid={session}".encode()),
    ]
    app = routing.live_application()
    comm = WebsocketCommunicator(app, "/inbox/ws/inbox/", headers=headers)
    connected, _ = await comm.connect(timeout=5)
    assert connected
    assert 'id="request-list"' in await comm.receive_from(timeout=5)
    await comm.disconnect()
    refused = WebsocketCommunicator(app, "/ws/inbox/", headers=headers)  # not mounted there
    with pytest.raises(ValueError, match="No route found"):
        await refused.connect(timeout=5)


# -- signing in -------------------------------------------------------------------------------


@pytest.mark.urls(FRESH_URLS)
@pytest.mark.django_db
def test_a_new_project_signs_reviewers_in_with_the_apps_page(settings):
    """The README's one line gives a new project a sign-in page: before, the inbox sent
    signed-out reviewers to /accounts/login/, a 404, and the admin's sign-in refused them
    (not staff)."""
    settings.LOGIN_URL = global_settings.LOGIN_URL
    settings.LOGIN_REDIRECT_URL = global_settings.LOGIN_REDIRECT_URL
    settings.LOGOUT_REDIRECT_URL = global_settings.LOGOUT_REDIRECT_URL
    reviewer = make_user(password="a reviewer's phrase 7")
    client = Client()
    to_sign_in = client.get("/approvals/")
    assert to_sign_in.status_code == 302
    assert to_sign_in["Location"] == "/accounts/login/?next=/approvals/"
    page = client.get(to_sign_in["Location"])
    assert page.status_code == 200
    text = page.content.decode()
    assert 'class="approvals-app"' in text and "<h1>Sign in</h1>" in text
    assert 'name="next" value="/approvals/"' in text

    wrong = client.post(
        "/accounts/login/", {"username": reviewer.username, "password": "not it", "next": "/"}
    )
    assert wrong.status_code == 200 and "did not match" in wrong.content.decode()
    signed_in = client.post(
        "/accounts/login/",
        {"username": reviewer.username, "password": "a reviewer's phrase 7", "next": "/approvals/"},
    )
    assert signed_in.status_code == 302 and signed_in["Location"] == "/approvals/"
    inbox = client.get("/approvals/").content.decode()
    assert 'id="request-list"' in inbox and 'action="/accounts/logout/"' in inbox

    signed_out = client.post("/accounts/logout/")
    assert signed_out.status_code == 200 and "You are signed out" in signed_out.content.decode()
    assert client.get("/approvals/").status_code == 302

    # Straight to the sign-in page, no ?next=: the inbox, not Django's /accounts/profile/.
    again = client.post(
        "/accounts/login/", {"username": reviewer.username, "password": "a reviewer's phrase 7"}
    )
    assert again["Location"] == "/approvals/"
    settings.LOGIN_REDIRECT_URL = "/admin/"  # a project's own choice wins
    client.post("/accounts/logout/")
    again = client.post(
        "/accounts/login/", {"username": reviewer.username, "password": "a reviewer's phrase 7"}
    )
    assert again["Location"] == "/admin/"


# -- the page frame and static files ---------------------------------------------------------


@pytest.mark.django_db
def test_pages_sit_in_the_projects_layout(settings):
    settings.TEMPLATES = [
        {**settings.TEMPLATES[0], "DIRS": [*settings.TEMPLATES[0]["DIRS"], HOST_TEMPLATES]}
    ]
    settings.TOOLNEXUS_BASE_TEMPLATE = "shop_base.html"
    page = session_client(make_user()).get("/").content.decode()
    assert "data-shop-layout" in page and "Shop navigation" in page
    assert "<title>Inbox | Shop</title>" in page
    assert 'id="request-list"' in page and "approvals/app.js" in page  # head and content


@pytest.mark.django_db
def test_the_default_frame_is_a_page_the_app_ships():
    page = session_client(make_user()).get("/").content.decode()
    assert page.startswith("<!doctype html>") and "<title>Inbox · toolnexus</title>" in page


def test_static_files_live_under_the_apps_name():
    for name in ("approvals/app.css", "approvals/app.js"):
        found = finders.find(name)
        assert found and Path(found).is_relative_to(Path(__file__).parents[2] / "approvals")


# -- serve and the groups command ------------------------------------------------------------


@pytest.mark.django_db
def test_demo_accounts_never_touch_a_user_serve_did_not_make():
    User = get_user_model()
    User.objects.create_user(username="admin", password="the-owners-password")
    plan = serve.plan_exposure("127.0.0.1", demo_accounts=True, debug=True)
    made = serve.make_demo_accounts(plan, "pw-1")
    assert [name for name, _ in made] == ["reviewer", "reviewer2", "watcher"]
    admin = User.objects.get(username="admin")
    assert admin.check_password("the-owners-password")
    assert not admin.is_superuser and not admin.is_staff
    made = serve.make_demo_accounts(plan, "pw-2")  # serve's own accounts: a fresh password
    assert [name for name, _ in made] == ["reviewer", "reviewer2", "watcher"]
    assert User.objects.get(username="reviewer").check_password("pw-2")
    assert User.objects.get(username="admin").check_password("the-owners-password")


def test_demo_accounts_are_opt_in(settings):
    del settings.TOOLNEXUS_DEMO_ACCOUNTS
    assert not serve.plan_exposure("127.0.0.1", demo_accounts=None, debug=True).demo_accounts
    settings.TOOLNEXUS_DEMO_ACCOUNTS = True
    assert serve.plan_exposure("127.0.0.1", demo_accounts=None, debug=True).demo_accounts


def test_serve_uses_the_projects_asgi_application(settings):
    settings.ASGI_APPLICATION = "tests.approvals.test_host_project.A_PROJECTS_APPLICATION"
    assert serve.load_asgi_application() is A_PROJECTS_APPLICATION
    del settings.ASGI_APPLICATION
    assert serve.load_asgi_application() is not A_PROJECTS_APPLICATION


async def A_PROJECTS_APPLICATION(scope, receive, send):  # a project's ASGI app
    raise AssertionError("never called")


def test_serve_uses_the_asgi_py_next_to_the_settings_without_asgi_application(settings):
    """startproject sets no ASGI_APPLICATION; the README adds the live pages' sockets to
    the project's asgi.py. Before, serve built an application of its own and ignored it."""
    from tests.approvals.host_project import asgi

    del settings.ASGI_APPLICATION
    settings.SETTINGS_MODULE = "tests.approvals.host_project.settings"
    assert serve.asgi_application_path() == "tests.approvals.host_project.asgi.application"
    assert serve.load_asgi_application() is asgi.application
    settings.SETTINGS_MODULE = "no_such_project.settings"  # no asgi.py there: the URLconf's
    assert serve.asgi_application_path() == "toolnexus_web.asgi.application"
    settings.ROOT_URLCONF = "tests.approvals.no_app_urls"
    settings.WSGI_APPLICATION = None
    assert serve.asgi_application_path() is None  # none: Django's with the live pages


def test_serve_names_the_projects_own_secret_key(settings):
    """A host project's SECRET_KEY is its own setting; before, serve said "random, this
    process only" (what the demo project says of a key it made up)."""
    del settings.TOOLNEXUS_SECRET_KEY_FILE
    assert serve.secret_key_source() == "the project's SECRET_KEY setting"
    settings.TOOLNEXUS_SECRET_KEY_FILE = None  # the demo project, with a key of its own making
    assert serve.secret_key_source() in ("random, this process only", "DJANGO_SECRET_KEY")


async def test_the_live_application_serves_static_files_with_debug_on(settings):
    """`daphne shop.asgi:application` (with `db_worker`) serves the pages' stylesheet and
    scripts with DEBUG on, as runserver and serve do; before, they were 404s."""
    import httpx

    settings.DEBUG = True
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if "WhiteNoise" not in m]
    application = routing.live_application()
    transport = httpx.ASGITransport(app=application)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
        response = await client.get("/static/approvals/app.js")
    assert response.status_code == 200 and "appData" in response.text
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

    loaded = serve.load_asgi_application()  # serve wraps it no second time
    assert not isinstance(getattr(loaded, "application", None), ASGIStaticFilesHandler)
    assert routing.with_static_files(application) is application
    assert routing.serves_websockets(application)
    settings.DEBUG = False  # WhiteNoise's job, or a web server's (collectstatic)
    assert not routing.serves_static_files()


def test_serve_says_when_the_application_refuses_websockets():
    from django.core.asgi import get_asgi_application

    assert not routing.serves_websockets(get_asgi_application())  # asgi.py left as it was
    assert not routing.serves_websockets(routing.with_static_files(get_asgi_application()))


def test_serve_does_not_reexecute_for_a_project_that_ignores_the_bind(settings):
    del settings.TOOLNEXUS_HOST
    assert serve.settings_env("0.0.0.0", ["example.com"]) == {}


@pytest.mark.django_db
def test_approvals_groups_command():
    Group.objects.filter(name__in=["Reviewers", "Watchers"]).delete()
    out = io.StringIO()
    call_command("approvals_groups", stdout=out)
    reviewers = Group.objects.get(name="Reviewers")
    assert set(reviewers.permissions.values_list("codename", flat=True)) == set(
        permissions.REVIEWER_PERMISSIONS
    )
    assert "decide_request" in out.getvalue()
    assert "decide_request" not in Group.objects.get(name="Watchers").permissions.values_list(
        "codename", flat=True
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("TOOLNEXUS_CLAIM_MINUTES", 10**9),  # past year 1: the lapse date overflows
        ("TOOLNEXUS_CLAIM_MINUTES", 10**400),  # too large for a float as well
        ("TOOLNEXUS_CLAIM_MINUTES", -1),
        ("TOOLNEXUS_CLAIM_MINUTES", "30"),
        ("TOOLNEXUS_INBOX_COUNT_CAP", 0),
        ("TOOLNEXUS_LIVE_CHIP_SECONDS", float("nan")),
        ("TOOLNEXUS_LIVE_CHIP_SECONDS", -0.5),
    ],
)
def test_check_e007_triage_settings_out_of_range(settings, name, value):
    setattr(settings, name, value)
    (error,) = checks.check_triage_settings()
    assert error.id == "approvals.E007" and name in error.msg and name in error.hint


def test_check_e007_accepts_the_ranges_ends(settings):
    settings.TOOLNEXUS_CLAIM_MINUTES = checks.MAX_CLAIM_MINUTES
    settings.TOOLNEXUS_LIVE_CHIP_SECONDS = 0
    settings.TOOLNEXUS_INBOX_COUNT_CAP = 1
    assert checks.check_triage_settings() == []
