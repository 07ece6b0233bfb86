"""approvals.domain.statements: the decision path's statements, written once per shape, store
and read every kind of value exactly as the ORM does (on SQLite and on PostgreSQL)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.models import F
from django.db.transaction import TransactionManagementError
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django_tasks_db.models import DBTaskResult

from approvals.domain import statements
from approvals.models import ApprovalRequest, Event, RequestCall, Run, ToolExecution

from .factories import in_another_connection

pytestmark = pytest.mark.django_db(transaction=True)


def _run(**fields) -> Run:
    return Run.objects.create(agent="demo", prompt="p", **fields)


def test_update_stores_each_kind_of_value_as_the_orm_reads_it():
    run = _run()
    at = timezone.now() + timedelta(minutes=5)
    messages = [{"role": "user", "content": 'héllo "quoted" ✓'}, {"n": 1.5, "none": None}]
    changed = statements.update(
        Run,
        {"pk": run.pk},
        {"messages": messages, "usage": {}, "lease_expires_at": at, "worker_id": "w:1"},
        add={"turns": 3, "version": 2},
    )
    assert changed == 1
    stored = Run.objects.get(pk=run.pk)
    assert stored.messages == messages
    assert stored.usage == {}
    assert stored.lease_expires_at == at
    assert stored.worker_id == "w:1"
    assert (stored.turns, stored.version) == (3, 2)


def test_update_changes_only_the_rows_its_conditions_name():
    queued, pending = _run(), _run(status=Run.Status.PENDING)
    changed = statements.update(
        Run, {"pk": pending.pk, "status": Run.Status.QUEUED}, {"status": Run.Status.RUNNING}
    )
    assert changed == 0
    assert Run.objects.get(pk=pending.pk).status == Run.Status.PENDING
    changed = statements.update(
        Run, {"status__ne": Run.Status.PENDING}, {"error": "x"}, add={"attempts": 1}
    )
    assert changed == 1
    assert Run.objects.get(pk=queued.pk).error == "x"
    assert Run.objects.get(pk=pending.pk).error == ""


def test_null_tests_are_part_of_the_shape():
    first = ApprovalRequest.objects.create(
        run=_run(), agent="demo", request_id="r1", kind="approval"
    )
    second = ApprovalRequest.objects.create(
        run=_run(), agent="demo", request_id="r2", kind="approval", applied_at=timezone.now()
    )
    # The same keys with the other truth value are another statement, not the cached one.
    assert statements.update(ApprovalRequest, {"applied_at__isnull": True}, {"reason": "a"}) == 1
    assert statements.update(ApprovalRequest, {"applied_at__isnull": False}, {"reason": "b"}) == 1
    assert ApprovalRequest.objects.get(pk=first.pk).reason == "a"
    assert ApprovalRequest.objects.get(pk=second.pk).reason == "b"


def test_a_json_column_set_to_none_is_sql_null_as_the_orm_stores_it():
    run = _run()
    row = ApprovalRequest.objects.create(run=run, agent="demo", request_id="r", kind="tool_call")
    call = RequestCall.objects.create(
        request=row, position=0, call_id="c", tool_name="t", edited_input={"a": 1}
    )
    statements.update(RequestCall, {"pk": call.pk}, {"edited_input": None})
    assert RequestCall.objects.filter(pk=call.pk, edited_input__isnull=True).exists()


def test_update_returning_reads_the_row_back_as_it_is_now():
    run = _run(messages=[{"role": "user", "content": "x"}], usage={"prompt_tokens": 4})
    now = timezone.now()
    back = statements.update(
        Run,
        {"pk": run.pk, "status": Run.Status.QUEUED},
        {"status": Run.Status.RUNNING, "updated_at": now},
        add={"attempts": 1},
        returning=True,
    )
    assert isinstance(back, Run) and not back._state.adding
    assert back.pk == run.pk and back.status == Run.Status.RUNNING and back.attempts == 1
    assert back.messages == [{"role": "user", "content": "x"}]
    assert back.usage == {"prompt_tokens": 4}
    assert back.updated_at == now and back.created_at == run.created_at
    assert back.started_by_id is None and back.finished_at is None
    # Nothing matched: None, and nothing written.
    again = statements.update(
        Run, {"pk": run.pk, "status": Run.Status.QUEUED}, {"error": "no"}, returning=True
    )
    assert again is None
    assert Run.objects.get(pk=run.pk).error == ""


def test_select_reads_instances_in_order_with_their_converted_values():
    run = _run()
    row = ApprovalRequest.objects.create(
        run=run, agent="demo", request_id="r", kind="tool_call", data={"calls": [1]}
    )
    for position in (1, 0):
        RequestCall.objects.create(
            request=row,
            position=position,
            call_id=f"c{position}",
            tool_name="t",
            input={"a": position},
            is_error=position == 1,
        )
    calls = statements.select(RequestCall, {"request_id": row.pk}, order_by=("position",))
    assert [(c.call_id, c.input, c.is_error) for c in calls] == [
        ("c0", {"a": 0}, False),
        ("c1", {"a": 1}, True),
    ]
    newest = statements.select(Event, {"run_id": run.pk}, order_by=("-id",), limit=1)
    assert newest == []
    with transaction.atomic():
        (read,) = statements.select(ApprovalRequest, {"request_id": "r"}, for_update=True)
    orm = ApprovalRequest.objects.get(pk=row.pk)
    assert {f.attname: getattr(read, f.attname) for f in ApprovalRequest._meta.concrete_fields} == {
        f.attname: getattr(orm, f.attname) for f in ApprovalRequest._meta.concrete_fields
    }


def test_an_in_condition_matches_any_of_its_values_with_a_shape_per_count():
    runs = [_run(status=status) for status in ("queued", "running", "done")]
    ids = [r.pk for r in runs]
    found = statements.select(Run, {"pk__in": ids[:2]}, order_by=("id",))
    assert [r.pk for r in found] == ids[:2]
    found = statements.select(Run, {"pk__in": ids, "status__ne": "running"}, order_by=("-id",))
    assert [r.pk for r in found] == [ids[2], ids[0]]
    assert statements.select(Run, {"pk__in": (ids[1],)})[0].status == "running"
    # Three values take the shape of four (the last one again): one shape per power of two.
    fourth = _run()
    assert statements._shape_keys({"pk__in": ids}) == statements._shape_keys(
        {"pk__in": [*ids, fourth.pk]}
    )
    assert statements._shape_keys({"pk__in": ids[:2]}) != statements._shape_keys({"pk__in": ids})
    assert len(statements.select(Run, {"pk__in": ids})) == 3
    assert len(statements.select(Run, {"pk__in": [*ids, fourth.pk]})) == 4
    with CaptureQueriesContext(connection) as ctx:
        assert statements.select(Run, {"pk__in": []}) == []  # IN () is no SQL: nothing runs
        assert statements.update(Run, {"pk__in": []}, {"error": "x"}) == 0
    assert ctx.captured_queries == []
    assert statements.update(Run, {"pk__in": ids[1:]}, {"error": "x"}) == 2  # 2 of 4 slots
    assert sorted(Run.objects.filter(error="x").values_list("pk", flat=True)) == ids[1:]
    assert statements.update(Run, {"pk__in": ids}, {"error": "y"}) == 3  # 3 of 4 slots


def test_insert_writes_several_rows_in_one_statement_with_their_defaults():
    run = _run()
    rows = [
        Event(run=run, action="a", detail={"k": [1, "two"]}),
        Event(run=run, action="b", from_state="x", to_state="y"),
    ]
    with CaptureQueriesContext(connection) as ctx:
        statements.insert(rows)
    assert sum(q["sql"].startswith("INSERT") for q in ctx.captured_queries) == 1
    stored = list(Event.objects.filter(run=run).order_by("id"))
    assert [(e.action, e.detail, e.from_state, e.to_state) for e in stored] == [
        ("a", {"k": [1, "two"]}, "", ""),
        ("b", {}, "x", "y"),
    ]
    assert all(e.created_at is not None for e in stored)


def test_an_insert_that_breaks_a_unique_key_raises_djangos_integrity_error():
    run = _run()
    key = {"run_id": run.pk, "message_index": 1, "call_id": "c"}
    statements.insert([ToolExecution(**key, tool_name="t", input={})])
    with pytest.raises(IntegrityError), transaction.atomic():
        statements.insert([ToolExecution(**key, tool_name="t", input={})])
    assert ToolExecution.objects.filter(**key).count() == 1


def test_what_would_not_mean_what_the_orm_means_is_refused():
    run = _run()
    with pytest.raises(ValueError, match="unsupported condition"):
        statements.update(Run, {"status__gt": "queued"}, {"error": ""})
    with pytest.raises(TypeError, match="a list of values"):
        statements.select(Run, {"status__in": "queued"})  # a string is no list of values
    with pytest.raises(ValueError, match="status__isnull"):
        statements.select(Run, {"status__in": ["queued", None]})
    # `= NULL` matches nothing where the ORM's `finished_at=None` is IS NULL.
    with pytest.raises(ValueError, match="finished_at__isnull"):
        statements.update(Run, {"finished_at": None}, {"error": ""})
    with pytest.raises(TypeError, match="expression"):
        statements.update(Run, {"pk": run.pk}, {"turns": F("turns") + 1})
    with pytest.raises(ValueError, match="nothing to set"):
        statements.update(Run, {"pk": run.pk}, {})
    # A row lock outside a transaction would end with its statement.
    with pytest.raises(TransactionManagementError):
        statements.select(Run, {"pk": run.pk}, for_update=True)
    with pytest.raises(ValueError, match="one model"):
        statements.insert([Event(run=run, action="a"), Run(agent="demo", prompt="p")])
    assert Run.objects.get(pk=run.pk).turns == 0 and not Event.objects.exists()


def test_an_insert_writes_a_key_the_database_does_not_generate():
    row = DBTaskResult(
        task_path="approvals.execution.runner.execute_run",
        args_kwargs={"args": [1], "kwargs": {}},
        queue_name="default",
        backend_name="default",
        run_after=timezone.now(),
    )
    statements.insert([row])
    assert DBTaskResult.objects.get(pk=row.pk).args_kwargs == {"args": [1], "kwargs": {}}


def test_an_insert_with_keys_gives_each_row_its_new_key_in_order():
    run = _run()
    row = ApprovalRequest(run=run, agent="demo", request_id="r", kind="tool_call")
    statements.insert([row], keys=True)
    assert row.pk is not None and not row._state.adding
    calls = [RequestCall(request=row, position=i, call_id=f"c{i}", tool_name="t") for i in range(3)]
    statements.insert(calls, keys=True)
    stored = dict(RequestCall.objects.filter(request=row).values_list("call_id", "pk"))
    assert {c.call_id: c.pk for c in calls} == stored
    calls[1].output = "changed"
    calls[1].save(update_fields=["output"])  # a saved instance: an UPDATE of its own row
    assert RequestCall.objects.get(pk=calls[1].pk).output == "changed"


@pytest.mark.postgres
def test_a_locked_read_holds_its_rows_until_the_transaction_ends(on_postgres):
    if not on_postgres:
        pytest.skip("needs PostgreSQL (set DATABASE_URL): SQLite locks the whole database")
    run = _run()
    seen: list[str] = []

    def try_to_lock() -> None:
        try:
            with transaction.atomic():
                Run.objects.select_for_update(nowait=True).get(pk=run.pk)
            seen.append("free")
        except DatabaseError:
            seen.append("locked")

    with transaction.atomic():
        (locked,) = statements.select(Run, {"pk": run.pk}, for_update=True)
        in_another_connection(try_to_lock)
    in_another_connection(try_to_lock)
    assert locked.pk == run.pk and seen == ["locked", "free"]
