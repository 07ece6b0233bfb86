from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    verbose_name = "Approvals"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The composition root: agents are discovered, and the live layer hears changes.
        from .agents.discovery import autodiscover
        from .live import access, publisher  # noqa: F401  (publisher hears approvals.events.changed)

        autodiscover()
        access.connect()
