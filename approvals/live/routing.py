"""The live pages' websocket routes, at the paths the project's URLconf gives them.

`approvals.urls` names the socket URLs (`approvals:live-inbox`, `approvals:live-run`) under
the app's mount, and templates reverse those names; the routes here are built from the same
names, so the page and the socket agree wherever the app is included. In the project's
asgi.py, after `get_asgi_application()`:

    from approvals.live.routing import live_application
    application = live_application(django_asgi_app)

or, with websocket routes of the project's own (Channels' URLRouter):

    from approvals.live.routing import websocket_urlpatterns
    URLRouter([*websocket_urlpatterns, *my_routes])

`websocket_urlpatterns` is read from the URLconf when it is imported (Django must be set up).
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.urls import NoReverseMatch, URLPattern, get_script_prefix, path, reverse

from . import consumers

INBOX_ROUTE = "ws/inbox/"
RUN_ROUTE = "ws/runs/<int:run_id>/"


def mount(urlconf: Any = None) -> str:
    """Where the project includes `approvals.urls` ("" at the root, "approvals/" under
    /approvals/), read from its URLconf."""
    try:
        inbox = reverse("approvals:live-inbox", urlconf=urlconf)
    except NoReverseMatch:
        raise ImproperlyConfigured(
            "The app's URLs are not in the URLconf: add "
            'path("approvals/", include("approvals.urls")) (any prefix) to urlpatterns '
            "before building the websocket routes."
        ) from None
    inbox = inbox.removeprefix(get_script_prefix()).lstrip("/")
    return inbox.removesuffix(INBOX_ROUTE)


def websocket_urlpatterns_for(urlconf: Any = None) -> list[URLPattern]:
    """The live pages' routes under the app's mount in `urlconf` (default ROOT_URLCONF)."""
    prefix = mount(urlconf)
    return [
        path(prefix + INBOX_ROUTE, consumers.InboxConsumer.as_asgi(), name="live-inbox"),
        path(prefix + RUN_ROUTE, consumers.RunConsumer.as_asgi(), name="live-run"),
    ]


def live_application(http_application: Any = None) -> Any:
    """The whole ASGI application: Django for HTTP (`http_application`, default
    `get_asgi_application()`), the live pages for websockets: same origin only
    (`origin.SameOriginValidator`), the session's user (Channels' AuthMiddlewareStack).
    With DEBUG on it serves static files too, as `runserver` does (`serves_static_files`):
    under any ASGI server (`daphne shop.asgi:application`), not only `manage.py serve`."""
    from channels.auth import AuthMiddlewareStack
    from channels.routing import ProtocolTypeRouter, URLRouter
    from django.core.asgi import get_asgi_application

    from .origin import SameOriginValidator

    http = http_application if http_application is not None else get_asgi_application()
    sockets = URLRouter(websocket_urlpatterns_for())
    application = ProtocolTypeRouter(
        {"http": http, "websocket": SameOriginValidator(AuthMiddlewareStack(sockets))}
    )
    return with_static_files(application)


WHITENOISE = "whitenoise.middleware.WhiteNoiseMiddleware"


def serves_static_files() -> bool:
    """Whether the ASGI application must serve static files itself: with DEBUG on, as
    `runserver` does, unless WhiteNoise's middleware does already. With DEBUG off that is
    WhiteNoise's or a web server's job (`collectstatic`), as in any Django project."""
    from django.apps import apps
    from django.conf import settings

    return (
        settings.DEBUG
        and apps.is_installed("django.contrib.staticfiles")
        and WHITENOISE not in settings.MIDDLEWARE
    )


def with_static_files(application: Any) -> Any:
    """`application`, serving static files first when `serves_static_files()` (once: an
    application that does already is returned as it is)."""
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

    if not serves_static_files() or isinstance(application, ASGIStaticFilesHandler):
        return application
    return ASGIStaticFilesHandler(application)


def serves_websockets(application: Any) -> bool:
    """False for Django's own ASGI handler (a project's asgi.py without `live_application`),
    which refuses every websocket: the live pages would never connect."""
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
    from django.core.handlers.asgi import ASGIHandler

    while isinstance(application, ASGIStaticFilesHandler):
        application = application.application
    return not isinstance(application, ASGIHandler)


def __getattr__(name: str) -> Any:
    # `from approvals.live.routing import websocket_urlpatterns`: built on first use, once
    # the URLconf can be read.
    if name == "websocket_urlpatterns":
        return websocket_urlpatterns_for()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
