"""Where agents come from: the demo and the demo team (TOOLNEXUS_DEMO_AGENT, off unless a
project turns it on), every installed app's agents.py, and the modules named in
TOOLNEXUS_AGENT_MODULES (imported once, at start-up)."""

from __future__ import annotations

from importlib import import_module

from django.apps import apps

from ..conf import app_settings
from .demo import register_demo_agent
from .demo_team import NAME as DEMO_TEAM
from .demo_team import register_demo_team
from .registry import get


def autodiscover() -> None:
    """Import every installed app's agents.py and the configured extra modules."""
    if app_settings.DEMO_AGENT and get("demo") is None:
        register_demo_agent()
    if app_settings.DEMO_AGENT and get(DEMO_TEAM) is None:
        register_demo_team()
    for config in apps.get_app_configs():
        if config.name == "approvals":
            continue
        try:
            import_module(f"{config.name}.agents")
        except ModuleNotFoundError as exc:
            if exc.name != f"{config.name}.agents":
                raise
    for module in app_settings.AGENT_MODULES:
        import_module(module)
