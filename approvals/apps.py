from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    verbose_name = "Approvals"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The composition root: settings get their defaults, the system checks are
        # registered, agents are discovered, and the live layer hears changes.
        from django.apps import apps

        from . import checks, conf
        from .agents.discovery import autodiscover
        from .execution import taskrow
        from .live import access, publisher  # noqa: F401  (publisher hears approvals.events.changed)
        from .telemetry import tracing

        conf.install_defaults()
        checks.register()
        autodiscover()
        if apps.is_installed("django_tasks_db"):  # else approvals.E003 says it is missing
            taskrow.connect()
        _connect_token_revocation()
        access.connect()
        _connect_stale_plan_recovery()
        # Before the server builds its middleware chain: Django's instrumentation adds one.
        tracing.setup()


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


# PostgreSQL's answer to a prepared statement whose result columns changed type since it
# was prepared (a migration ran while this process kept its connections).
STALE_PLAN = "cached plan must not change result type"


def _connect_stale_plan_recovery() -> None:
    """With prepared statements (DATABASE_PREPARED, the default on PostgreSQL), a migration
    that changes a column's type makes every statement a pooled connection prepared before
    it fail, on every run: psycopg forgets its prepared statements on a rollback, and a read
    in autocommit has none. So such a read drops the connection's prepared statements
    (`DEALLOCATE ALL`, which psycopg notices) and runs once more; in a transaction the error
    stands, and the rollback that follows clears them."""
    from django.db.backends.signals import connection_created

    connection_created.connect(_install_replan, dispatch_uid="approvals.stale_plan")


def _install_replan(sender, connection, **kwargs) -> None:
    options = connection.settings_dict.get("OPTIONS", {})
    if connection.vendor != "postgresql" or options.get("prepare_threshold") is None:
        return
    if _replan_stale_statement not in connection.execute_wrappers:
        # First: an `execute_wrapper` block open now pops the last wrapper when it ends.
        connection.execute_wrappers.insert(0, _replan_stale_statement)


def _replan_stale_statement(execute, sql, params, many, context):
    from django.db import NotSupportedError

    try:
        return execute(sql, params, many, context)
    except NotSupportedError as exc:
        connection = context["connection"]
        if STALE_PLAN not in str(exc) or connection.in_atomic_block:
            raise
        connection.connection.execute("DEALLOCATE ALL")
        return execute(sql, params, many, context)
