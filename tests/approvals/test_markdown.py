"""Model replies, prompts and descriptions as sanitized Markdown; request URLs linked only for
http(s); tool arguments as a table with the raw JSON behind a <details>."""

from __future__ import annotations

import re

import pytest
from django.template import Context, Template

from approvals.models import ApprovalRequest, Run
from approvals.templatetags.approvals_tags import (
    MARKDOWN_MAX_CHARS,
    arg_rows,
    markdown,
    render_markdown,
    safe_url,
)

from .factories import make_user, session_client, start_and_halt

HOSTILE_IMG = "<img src=x onerror=window.__xss=1>"
HOSTILE_SCRIPT = "<script>window.__xss=1</script>"
ESCAPED_IMG = "&lt;img src=x onerror=window.__xss=1&gt;"
ESCAPED_SCRIPT = "&lt;script&gt;window.__xss=1&lt;/script&gt;"


def tags_in(html: str) -> set[str]:
    return {t.lower() for t in re.findall(r"<\s*([a-zA-Z][a-zA-Z0-9]*)", html)}


def hrefs(html: str) -> list[str]:
    return re.findall(r'href="([^"]*)"', html)


# -- the markdown filter -------------------------------------------------------------------


def test_emphasis_lists_and_code():
    html = render_markdown("**bold** and *em* and `x < 1`\n\n- one\n- two\n\n1. first\n2. second")
    assert "<strong>bold</strong>" in html
    assert "<em>em</em>" in html
    assert "<code>x &lt; 1</code>" in html
    assert "<ul>\n<li>one</li>\n<li>two</li>\n</ul>" in html
    assert "<ol>\n<li>first</li>\n<li>second</li>\n</ol>" in html


def test_fenced_code_keeps_its_lines_and_escapes_its_markup():
    html = render_markdown("```html\n<b>hi</b>\nline 2\n```")
    assert html.startswith("<pre><code>")
    assert "&lt;b&gt;hi&lt;/b&gt;\nline 2" in html
    assert "class=" not in html  # the language class is dropped with every other attribute


def test_single_line_breaks_are_kept():
    html = render_markdown("first line\nsecond line\n\nnew paragraph")
    assert "<p>first line<br>\nsecond line</p>" in html
    assert "<p>new paragraph</p>" in html


@pytest.mark.parametrize(
    "source", [HOSTILE_SCRIPT, HOSTILE_IMG, f"**hi** {HOSTILE_IMG}", f"- {HOSTILE_SCRIPT}"]
)
def test_raw_html_is_text(source):
    html = render_markdown(source)
    assert tags_in(html) <= {"p", "strong", "ul", "li"}
    assert "<img" not in html
    assert "<script" not in html
    assert ESCAPED_IMG in html or ESCAPED_SCRIPT in html


@pytest.mark.parametrize(
    "source",
    [
        "[x](javascript:alert(1))",
        "[x](JaVaScRiPt:alert(1))",
        "[x](javascript&#58;alert(1))",
        "[x](java\tscript:alert(1))",
        "[x](vbscript:msgbox(1))",
        "[x](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
        "[x](data:image/png;base64,iVBORw0KGgo=)",
        "[x](file:///etc/passwd)",
        "[x](mailto:a@example.com)",
        "<mailto:a@example.com>",
        "[x](/accounts/logout/)",
        "[x](//evil.example/)",
        "[x][r]\n\n[r]: javascript:alert(1)",
    ],
)
def test_links_other_than_http_and_https_are_not_links(source):
    html = render_markdown(source)
    assert "<a" not in html
    assert hrefs(html) == []
    assert 'target="_blank"' not in html


def test_http_links_open_in_a_new_tab_without_referrer():
    html = render_markdown('see [the docs](https://example.com/a?b=1&c="2") and <http://x.test/>')
    links = re.findall(r"<a [^>]*>", html)
    assert len(links) == 2
    for link in links:
        assert 'target="_blank"' in link
        assert 'rel="noopener noreferrer nofollow"' in link
    assert hrefs(html) == ["https://example.com/a?b=1&amp;c=%222%22", "http://x.test/"]


def test_images_are_dropped_but_their_alt_text_stays():
    html = render_markdown("![a chart](https://tracker.example/pixel.png) after")
    assert "<img" not in html
    assert "tracker.example" not in html
    assert "a chart after" in html


def test_headings_do_not_enter_the_page_outline():
    html = render_markdown("# Big\n## Smaller\ntext")
    assert not re.search(r"<h[1-6]", html)
    assert "<p><strong>Big</strong></p>" in html


def test_tables_have_no_inline_style():
    html = render_markdown("| a | b |\n|:-|--:|\n| 1 | 2 |")
    assert "<table>" in html
    assert "<td>2</td>" in html
    assert "style=" not in html


@pytest.mark.parametrize("value", [None, "", "   \n"])
def test_empty_input_gives_nothing(value):
    assert render_markdown(value) == ""
    assert markdown(value) == ""


@pytest.mark.parametrize(
    ("value", "html"),
    [(42, "<p>42</p>\n"), (True, "<p>True</p>\n"), (["<b>"], "<p>['&lt;b&gt;']</p>\n")],
)
def test_non_strings_are_rendered_as_their_text(value, html):
    assert render_markdown(value) == html


def test_huge_input_is_cut():
    html = render_markdown("x" * (MARKDOWN_MAX_CHARS + 5000))
    assert html.count("x") <= MARKDOWN_MAX_CHARS + 10
    assert "5,000 more characters not shown" in html


def test_the_filter_marks_its_output_safe_in_a_template():
    out = Template("{% load approvals_tags %}<div>{{ text|markdown }}</div>").render(
        Context({"text": f"**a**\nb {HOSTILE_IMG}"})
    )
    assert out == f"<div><p><strong>a</strong><br>\nb {ESCAPED_IMG}</p>\n</div>"


# -- safe_url ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://example.com/x?y=1", "https://example.com/x?y=1"),
        ("  HTTP://Example.com  ", "HTTP://Example.com"),
        ("javascript:alert(1)", ""),
        (" javascript:alert(1)", ""),
        ("java\nscript:alert(1)", ""),
        ("http://exa\nmple.com", ""),
        ("data:text/html,hi", ""),
        ("//evil.example/", ""),
        ("/relative", ""),
        ("http://", ""),
        ("http:evil", ""),
        (None, ""),
        (5, ""),
    ],
)
def test_safe_url(url, expected):
    assert safe_url(url) == expected


# -- arg_rows and the _args partial ----------------------------------------------------------


def test_arg_rows_kinds():
    rows = arg_rows({"order": "A-1", "amount": 5, "ok": True, "none": None, "tags": ["a"], "e": ""})
    assert rows == [
        {"name": "order", "kind": "text", "text": "A-1"},
        {"name": "amount", "kind": "code", "text": "5"},
        {"name": "ok", "kind": "code", "text": "true"},
        {"name": "none", "kind": "code", "text": "null"},
        {"name": "tags", "kind": "code", "text": '["a"]'},
        {"name": "e", "kind": "code", "text": '""'},
    ]
    assert arg_rows(["a"]) is None
    assert arg_rows("text") is None
    assert arg_rows(None) is None


def _args(value) -> str:
    return Template(
        '{% include "approvals/_args.html" with value=value label="arguments of x" only %}'
    ).render(Context({"value": value}))


def test_args_partial_renders_a_table_and_the_raw_json_behind_details():
    html = _args({"note": f"line 1\nline 2 {HOSTILE_SCRIPT}", "amount": 5, "meta": {"k": [1]}})
    assert '<table class="args-table" aria-label="arguments of x">' in html
    assert '<th scope="row"><code>note</code></th>' in html
    assert f'<span class="arg-text">line 1\nline 2 {ESCAPED_SCRIPT}</span>' in html
    assert "<td><code>5</code></td>" in html
    assert "<code>{&quot;k&quot;: [1]}</code>" in html
    raw = re.search(
        r"<details class=\"raw-json\"><summary>Raw JSON</summary>(.*?)</details>", html, re.S
    )
    assert raw, html
    assert raw.group(1).startswith('<pre class="json" aria-label="arguments of x as JSON">{\n')
    assert "&quot;amount&quot;: 5" in raw.group(1)
    assert "<script" not in html


@pytest.mark.parametrize("value", [["a", 1], "just text", None])
def test_args_partial_falls_back_to_the_raw_json(value):
    html = _args(value)
    assert "<table" not in html
    assert "<details" not in html
    assert html.startswith('<pre class="json" aria-label="arguments of x">')


# -- pages ---------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_run_page_renders_replies_as_markdown_and_escapes_hostile_html():
    user = make_user()
    reply = (
        f"**Done.** Refund issued\nsecond line\n\n- item `A-1`\n\n{HOSTILE_IMG} {HOSTILE_SCRIPT}"
    )
    run = Run.objects.create(
        agent="demo",
        prompt="Refund *order* A-1\nplease",
        status=Run.Status.DONE,
        text=reply,
        messages=[
            {"role": "user", "content": "Refund *order* A-1\nplease"},
            {"role": "assistant", "content": reply},
        ],
    )
    page = session_client(user).get(f"/runs/{run.pk}/").content.decode()
    assert '<div class="text md"><p>Refund <em>order</em> A-1<br>\nplease</p>' in page
    assistant = re.search(r'Assistant</span><div class="text md">(.*?)</div>', page, re.S)
    assert assistant, page
    assert "<strong>Done.</strong> Refund issued<br>\nsecond line" in assistant.group(1)
    assert "<li>item <code>A-1</code></li>" in assistant.group(1)
    final = re.search(r'Final answer</h2>\s*<div class="text md">(.*?)</div>', page, re.S)
    assert final and "<strong>Done.</strong>" in final.group(1)
    assert HOSTILE_IMG not in page
    assert HOSTILE_SCRIPT not in page
    assert page.count(ESCAPED_IMG) == 2  # the transcript and the final answer
    assert page.count(ESCAPED_SCRIPT) == 2


@pytest.mark.django_db(transaction=True)
def test_inbox_keeps_a_multi_line_prompts_lines_and_shows_arguments_as_a_table():
    user = make_user()
    run = start_and_halt(user=user, prompt="Refund order A-1001, $250\n**urgent**: customer waited")
    page = session_client(user).get(f"/?r={run.requests.get().request_id}").content.decode()
    asked = re.search(r'<div class="asked">(.*?)</div></div>', page, re.S)
    assert asked, page
    assert "Refund order A-1001, $250<br>\n<strong>urgent</strong>: customer waited" in asked.group(
        1
    )
    card = page[page.index(f'data-request-id="{run.requests.get().request_id}"') :]
    assert '<table class="args-table" aria-label="arguments of refund">' in card
    assert "<summary>Raw JSON</summary>" in card
    # the run page shows the model's call the same way
    run_page = session_client(user).get(f"/runs/{run.pk}/").content.decode()
    transcript = run_page[run_page.index('aria-label="Transcript"') :]
    assert '<table class="args-table" aria-label="arguments of refund">' in transcript


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("url", "linked"),
    [
        ("javascript:alert(1)", False),
        ("data:text/html,<script>alert(1)</script>", False),
        ("https://auth.example/consent?x=1", True),
    ],
)
def test_a_request_url_is_a_link_only_for_http_and_https(url, linked):
    user = make_user()
    run = start_and_halt(user=user)
    ApprovalRequest.objects.filter(run=run).update(
        kind="authorization", url=url, prompt="Sign in to the billing system"
    )
    page = session_client(user).get(f"/?r={run.requests.get().request_id}").content.decode()
    line = re.search(r'<p class="url">(.*?)</p>', page, re.S)
    assert line, page
    if linked:
        assert f'<a href="{url.replace("&", "&amp;")}"' in line.group(1)
        assert 'rel="noopener noreferrer nofollow"' in line.group(1)
    else:
        assert "<a " not in line.group(1)
        assert 'href="javascript:' not in page
        assert 'href="data:' not in page
        assert "not a web link" in line.group(1)
        assert "<script>" not in page
