from __future__ import annotations

import functools
import json
from typing import Any
from urllib.parse import urlsplit

import nh3
from django import template
from django.conf import settings
from django.shortcuts import resolve_url
from django.utils import timezone
from django.utils.safestring import mark_safe
from markdown_it import MarkdownIt
from markdown_it.common.utils import escapeHtml as escape_html

from ..domain.teams import chain_of
from ..permissions import perm
from ..selectors import count_label as _count_label

register = template.Library()


@register.filter
def pretty_json(value: Any) -> str:
    """Indented JSON as text; the template's autoescape keeps hostile strings inert."""
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


@register.filter
def count_label(value: Any) -> str:
    """An inbox count as shown: "12", or "1000+" where counting stopped (the cap)."""
    try:
        return _count_label(int(value))
    except (TypeError, ValueError):
        return str(value)


@register.filter
def compact_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


@register.filter
def iso(value: Any) -> str:
    return value.isoformat(timespec="seconds") if value else ""


@register.filter
def is_past(value: Any) -> bool:
    return bool(value) and value <= timezone.now()


# -- Markdown for model replies, prompts and descriptions ----------------------------------
#
# markdown-it-py (CommonMark, raw HTML off) renders; nh3 then keeps only a small allowlist, so
# a reply's own tags come out as text and nothing it writes can run or load. Links survive
# only for http(s), open in a new tab and carry rel="noopener noreferrer nofollow"; images are
# shown as their alt text (no remote loads); headings become bold paragraphs so a reply never
# adds to the page's outline.

MARKDOWN_MAX_CHARS = 100_000
_LINK_SCHEMES = ("http://", "https://")
_MD_TAGS = {
    "p", "br", "strong", "em", "del", "s", "code", "pre", "blockquote", "hr",
    "ul", "ol", "li", "a", "table", "thead", "tbody", "tr", "th", "td",
}  # fmt: skip


def _is_web_url(url: str) -> bool:
    """http(s) with a host, and nothing a browser would strip to change the scheme."""
    if not url.lower().startswith(_LINK_SCHEMES):
        return False
    if any(ord(ch) < 0x21 or ord(ch) == 0x7F for ch in url):
        return False
    try:
        return bool(urlsplit(url).hostname)
    except ValueError:
        return False


def _hide_unsafe_links(state: Any) -> None:
    """Core rule: a link whose target is not http(s) renders as its text only."""
    for block in state.tokens:
        if block.type != "inline" or not block.children:
            continue
        opened: list[bool] = []
        for token in block.children:
            if token.type == "link_open":
                keep = _is_web_url(str(token.attrGet("href") or ""))
                opened.append(keep)
                token.hidden = not keep
            elif token.type == "link_close":
                token.hidden = not (opened.pop() if opened else False)


def _render_image(self: Any, tokens: list, idx: int, options: Any, env: Any) -> str:
    alt = self.renderInlineAsText(tokens[idx].children or [], options, env)
    return escape_html(alt)


def _render_heading_open(self: Any, tokens: list, idx: int, options: Any, env: Any) -> str:
    return "<p><strong>"


def _render_heading_close(self: Any, tokens: list, idx: int, options: Any, env: Any) -> str:
    return "</strong></p>\n"


def _make_markdown() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "breaks": True})
    md.enable(["table", "strikethrough"])
    md.core.ruler.push("toolnexus_safe_links", _hide_unsafe_links)
    md.add_render_rule("image", _render_image)
    md.add_render_rule("heading_open", _render_heading_open)
    md.add_render_rule("heading_close", _render_heading_close)
    return md


_MARKDOWN = _make_markdown()
_CLEANER = nh3.Cleaner(
    tags=_MD_TAGS,
    clean_content_tags={"script", "style"},
    attributes={"a": {"href"}, "ol": {"start"}},
    link_rel="noopener noreferrer nofollow",
    set_tag_attribute_values={"a": {"target": "_blank"}},
    url_schemes={"http", "https"},
    url_relative="deny",
    strip_comments=True,
)


def render_markdown(value: Any) -> str:
    """Sanitized HTML for untrusted Markdown text (None and non-strings are safe)."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else str(value)
    if not text.strip():
        return ""
    return _render_text(text)


# A transcript is rendered again on every change to its run (pages, live pushes) while its
# messages stay the same: the same text gives the same HTML, so recent ones are kept.
@functools.lru_cache(maxsize=4096)
def _render_text(text: str) -> str:
    cut = len(text) - MARKDOWN_MAX_CHARS
    if cut > 0:
        text = text[:MARKDOWN_MAX_CHARS] + f"\n\n*(… {cut:,} more characters not shown)*"
    return _CLEANER.clean(_MARKDOWN.render(text))


@register.filter(is_safe=True)
def markdown(value: Any) -> str:
    """`{{ text|markdown }}`: the text rendered as Markdown, sanitized; render it in a
    block element (it yields paragraphs and lists)."""
    return mark_safe(render_markdown(value))  # the output of nh3 only


@register.filter
def safe_url(value: Any) -> str:
    """The URL, stripped, if it is an http(s) URL a link may point at; "" otherwise (show
    those as text)."""
    if not isinstance(value, str):
        return ""
    url = value.strip()
    return url if _is_web_url(url) else ""


# -- tool arguments as a table -------------------------------------------------------------


@register.filter
def arg_rows(value: Any) -> list[dict[str, str]] | None:
    """A JSON object's members as table rows, `{"name", "kind", "text"}` where kind is
    "text" (a non-empty string, shown as is) or "code" (anything else, as compact JSON);
    None for anything that is not an object (shown as raw JSON only)."""
    if not isinstance(value, dict):
        return None
    rows = []
    for name, item in value.items():
        if isinstance(item, str) and item:
            rows.append({"name": str(name), "kind": "text", "text": item})
        else:
            rows.append({"name": str(name), "kind": "code", "text": compact_json(item)})
    return rows


# -- what the app's page frame needs from the project ----------------------------------------


@register.filter
def approvals_can(who: Any, codename: str) -> bool:
    """`{% if perms|approvals_can:"add_run" %}`: a permission of this app by codename, under
    the app's own label. Takes the `perms` wrapper (also in pushed fragments, which carry no
    request) or a user."""
    user = getattr(who, "user", who)
    return bool(user is not None and hasattr(user, "has_perm") and user.has_perm(perm(codename)))


@register.simple_tag
def snooze_zones_known() -> bool:
    """Whether the server reads the browser's time zone on a snooze (it has a time zone
    database): the snooze form's `data-zones`, see web.triage.has_zone_database."""
    from ..web import triage  # the web layer's; imported when a page renders, not before

    return triage.has_zone_database()


@register.simple_tag
def approvals_login_url() -> str:
    """The project's sign-in page (settings.LOGIN_URL, a path or a URL name)."""
    return resolve_url(settings.LOGIN_URL)


@register.filter
def agent_chain(data: Any) -> list[str]:
    """The agents of a team a request climbed from, top first (its `data.path`): [] for a
    single agent's request."""
    return chain_of(data)
