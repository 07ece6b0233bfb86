"""approvals.presenters.cards: a question's options and its typed answer ("Other")."""

from __future__ import annotations

import pytest
from django.http import QueryDict

from approvals.presenters.cards import (
    _questions,
    question_answers,
    request_card,
    request_row,
    typed_texts,
)

from .factories import make_user, session_client
from .test_web_views import HX, make_row, url

PLAN = {"question": "Which plan?", "header": "Plan", "options": [{"label": "basic"}, "pro"]}
FIXED = {**PLAN, "question": "Which region?", "options": ["eu", "us"], "custom": False}
OPEN = {"question": "When should we call?"}


def post(**values: str) -> QueryDict:
    data = QueryDict(mutable=True)
    for name, value in values.items():
        data[name.replace("_", ".")] = value
    return data


def test_a_question_allows_a_typed_answer_unless_it_says_custom_false():
    plan, fixed, open_ = _questions({"questions": [PLAN, FIXED, OPEN]})
    assert (plan.options, plan.allows_other) == (["basic", "pro"], True)
    assert (fixed.options, fixed.allows_other) == (["eu", "us"], False)
    assert (open_.options, open_.html_name, plan.other_name) == ([], "q.2", "q.0.other")


@pytest.mark.parametrize(
    ("values", "answer", "problem"),
    [
        ({"q_0": "pro", "q_0_other": "ignored"}, "pro", ""),  # the radio decides
        ({"q_0": "", "q_0_other": "  enterprise  "}, "enterprise", ""),  # "Other" chosen
        ({"q_0_other": "enterprise"}, "enterprise", ""),  # typed, "Other" not clicked
        ({"q_0": "", "q_0_other": " "}, "", "Type your answer to “Which plan?”"),
        ({"q_0": "gold"}, "", "Choose one of the options for “Which plan?”."),
        ({}, "", "Answer every question (missing: Which plan?)."),
    ],
)
def test_an_answer_is_an_option_or_the_typed_text(values, answer, problem):
    answers, said = question_answers(_questions({"questions": [PLAN]}), post(**values))
    assert answers == {"Which plan?": answer}
    assert said.startswith(problem) and bool(said) == bool(problem)


def test_a_question_restricted_to_its_options_refuses_a_typed_answer():
    questions = _questions({"questions": [FIXED]})
    answers, said = question_answers(questions, post(q_0="", q_0_other="asia"))
    assert said == "Choose one of the options for “Which region?”."
    assert answers == {"Which region?": ""}


@pytest.mark.django_db
def test_the_inbox_offers_other_only_where_the_question_allows_it():
    row = make_row("question", {"questions": [PLAN, FIXED]})
    client = session_client(make_user(role="reviewer"))
    html = client.get(f"/?r={row.request_id}").content.decode()
    assert 'name="q.0" value="" data-other' in html and 'name="q.0.other"' in html
    assert 'name="q.1.other"' not in html and 'name="q.1" value="" data-other' not in html

    refused = client.post(
        url(row, "respond"), {"q.0": "pro", "q.1": "", "q.1.other": "asia"}, headers=HX
    )
    assert "Choose one of the options for “Which region?”." in refused.content.decode()
    row.refresh_from_db()
    assert row.state == "pending"

    sent = client.post(url(row, "respond"), {"q.0": "", "q.0.other": "gold", "q.1": "eu"})
    assert sent.status_code == 302
    row.refresh_from_db()
    assert row.state == "answered"
    assert row.answer["data"] == {"answers": {"Which plan?": "gold", "Which region?": "eu"}}


@pytest.mark.django_db
def test_a_late_typed_answer_is_kept_under_its_question_and_a_choice_is_not():
    row = make_row("question", {"questions": [PLAN, OPEN]})
    card = request_card(row, can_decide=True)
    typed = typed_texts(card, post(q_0="", q_0_other="enterprise", q_1="Monday"))
    assert typed == [("Which plan?", "enterprise"), ("When should we call?", "Monday")]
    assert typed_texts(card, post(q_0="pro")) == []


@pytest.mark.django_db
def test_two_question_rows_of_different_runs_read_apart_by_what_each_run_was_asked():
    first = make_row("question", {"questions": [PLAN]})
    second = make_row("question", {"questions": [PLAN]})
    one, two = request_row(first), request_row(second)
    assert (one.what, one.summary) == (two.what, two.summary)  # the same question...
    assert (one.gist, two.gist) == (first.run.prompt, second.run.prompt)  # ...asked apart
    first.run.prompt = "Please " + "ask the customer about their plan " * 5
    assert len(request_row(first).gist) == 60 and request_row(first).gist.endswith("…")
    html = session_client(make_user(role="reviewer")).get("/").content.decode()
    assert f"“{second.run.prompt}”" in html
