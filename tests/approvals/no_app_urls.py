"""A URLconf that forgot the app (the checks and the websocket routes say so)."""

urlpatterns: list = []
