"""Bench-only settings: the app's own settings plus one URL, the decision FLOOR view.

Used by bench/decision_latency.py and bench/throughput.py for every server and worker they
start (DJANGO_SETTINGS_MODULE=bench.floor_settings), so the app runs exactly as configured by
toolnexus_web.settings from the same environment; only ROOT_URLCONF differs.
"""

from toolnexus_web.settings import *  # noqa: F403

ROOT_URLCONF = "bench.floor_urls"
