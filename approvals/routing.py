"""Websocket routes (consumers arrive with the live inbox)."""

websocket_urlpatterns: list = []
