from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    verbose_name = "Approvals"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The composition root: settings get their defaults, the system checks are
        # registered, agents are discovered, and the live layer hears changes.
        from . import checks, conf
        from .agents.discovery import autodiscover
        from .live import access, publisher  # noqa: F401  (publisher hears approvals.events.changed)

        conf.install_defaults()
        checks.register()
        autodiscover()
        _connect_token_revocation()
        access.connect()


def _connect_token_revocation() -> None:
    """A user's API tokens are revoked when their password changes (services/tokens.py)."""
    from django.contrib.auth import get_user_model
    from django.db.models.signals import post_save, pre_save

    from .services import tokens

    User = get_user_model()
    pre_save.connect(
        tokens.note_password_change, sender=User, dispatch_uid="approvals.tokens.password"
    )
    post_save.connect(
        tokens.revoke_tokens_after_password_change,
        sender=User,
        dispatch_uid="approvals.tokens.revoke",
    )
