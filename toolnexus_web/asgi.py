"""ASGI entry point: HTTP through Django, websockets through Channels (authenticated)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "toolnexus_web.settings")
django_asgi_app = get_asgi_application()  # before importing consumers: it sets Django up

from approvals.live.routing import live_application  # noqa: E402

# The live pages' sockets follow the app's mount in urls.py (here the root: /ws/...).
application = live_application(django_asgi_app)
