"""A project package laid out as `startproject` makes it (settings, urls, asgi side by side),
for serve's search of the asgi.py next to the settings."""
