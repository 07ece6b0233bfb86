from django.urls import path

from . import consumers

websocket_urlpatterns = [
    path("ws/inbox/", consumers.InboxConsumer.as_asgi()),
    path("ws/runs/<int:run_id>/", consumers.RunConsumer.as_asgi()),
]
