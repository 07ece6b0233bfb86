# Triage inbox (issue 14): claims, per-reviewer snooze/ignore, the search column and the
# indexes the inbox's sorts and search use.

import json
import warnings

import django.db.models.deletion
from django.conf import settings
from django.db import DatabaseError, migrations, models, transaction

TRGM_INDEX = "req_search_trgm"
COUNTS_INDEX = "req_inbox_counts"


SEARCH_TEXT_CHARS = 8000


def search_text_of(*, agent, kind, prompt, data, run_prompt=""):
    """approvals.models.search_text_of as of this migration (frozen here)."""
    data = data if isinstance(data, dict) else {}
    parts = [agent, prompt]
    if run_prompt and run_prompt != prompt:
        parts.append(run_prompt)
    calls = data.get("calls") if kind == "tool_call" else None
    if not isinstance(calls, list):
        calls = [data] if data.get("tool") or data.get("callId") else []
    for call in calls:
        if not isinstance(call, dict):
            continue
        parts.append(str(call.get("name") or call.get("tool") or ""))
        arguments = call.get("arguments")
        if isinstance(arguments, str) and arguments.strip() not in ("", "{}"):
            parts.append(arguments)
        elif call.get("input"):
            parts.append(json.dumps(call["input"], ensure_ascii=False))
    return "\n".join(p for p in parts if p).lower()[:SEARCH_TEXT_CHARS]


def fill_search_text(apps, schema_editor):
    """Existing requests get the search text new ones get when they are made."""
    ApprovalRequest = apps.get_model("approvals", "ApprovalRequest")
    db = schema_editor.connection.alias
    rows = (
        ApprovalRequest.objects.using(db)
        .select_related("run")
        .only("id", "agent", "kind", "prompt", "data", "run__prompt")
        .order_by("pk")
    )
    batch = []
    for row in rows.iterator(chunk_size=2000):
        row.search_text = search_text_of(
            agent=row.agent,
            kind=row.kind,
            prompt=row.prompt,
            data=row.data,
            run_prompt=row.run.prompt,
        )
        batch.append(row)
        if len(batch) >= 2000:
            ApprovalRequest.objects.using(db).bulk_update(batch, ["search_text"])
            batch = []
    if batch:
        ApprovalRequest.objects.using(db).bulk_update(batch, ["search_text"])


def postgres_indexes(apps, schema_editor):
    """PostgreSQL only (SQLite scans; its inboxes are small):

    - a pg_trgm GIN index, so `search_text LIKE '%word%'` is an index scan;
    - a covering index for the inbox's counts (selectors.inbox_counts): every column they
      read, so counting 100k pending requests is an index-only scan, not a read of the
      table's wide rows (Django's Index(include=...) would warn on SQLite)."""
    if schema_editor.connection.vendor != "postgresql":
        return
    table = schema_editor.quote_name("approvals_approvalrequest")
    # A database role that may not create extensions still migrates: the search then scans.
    try:
        with transaction.atomic(using=schema_editor.connection.alias):
            schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    except DatabaseError as exc:
        warnings.warn(
            f"pg_trgm is not available ({exc}); the inbox search works without its index,"
            " slower on large inboxes. A superuser can run CREATE EXTENSION pg_trgm and"
            " then migrate approvals back to 0003 and forward again.",
            stacklevel=1,
        )
    else:
        schema_editor.execute(
            f"CREATE INDEX IF NOT EXISTS {TRGM_INDEX} ON {table}"
            " USING gin (search_text gin_trgm_ops)"
        )
    schema_editor.execute(
        f"CREATE INDEX IF NOT EXISTS {COUNTS_INDEX} ON {table} (state, agent, kind)"
        " INCLUDE (id, claimed_by_id, claimed_at, expires_at)"
    )


def drop_postgres_indexes(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX IF EXISTS {TRGM_INDEX}")
        schema_editor.execute(f"DROP INDEX IF EXISTS {COUNTS_INDEX}")


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0003_elicitation"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="RequestHide",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "until",
                    models.DateTimeField(
                        blank=True, help_text="Empty: ignored until un-hidden.", null=True
                    ),
                ),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                (
                    "request",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="hides",
                        to="approvals.approvalrequest",
                    ),
                ),
                (
                    "user",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={
                "verbose_name": "hidden request",
                "ordering": ["-created_at", "-id"],
                "constraints": [
                    models.UniqueConstraint(fields=("request", "user"), name="hide_once_per_user")
                ],
            },
        ),
        migrations.AddField(
            model_name="approvalrequest",
            name="claimed_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="approvalrequest",
            name="claimed_by",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AddField(
            model_name="approvalrequest",
            name="search_text",
            field=models.TextField(blank=True, default="", editable=False),
        ),
        migrations.AddIndex(
            model_name="approvalrequest",
            index=models.Index(
                fields=["state", "expires_at", "-created_at", "-id"], name="req_inbox_deadline"
            ),
        ),
        migrations.RunPython(fill_search_text, migrations.RunPython.noop, elidable=True),
        migrations.RunPython(postgres_indexes, drop_postgres_indexes),
    ]
