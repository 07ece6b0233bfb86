"""The inbox's density, looks and access in a real browser (issue 33): one toolbar row and at
least 12 rows on a 1280 x 800 screen, the list in a phone's top third, no key hints on touch
screens, every text at least 4.5:1 in both themes, the bulk buttons only with a selection
(disabled without), one confirmation per bulk decision, skip links, the snooze minutes box,
and Approve beside "Edit arguments". The figures
measured are printed (`-s`) and shown in the screenshots (list, detail, phone, dark)."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from .test_inbox import card_of, halted_run, login, open_inbox, row_of, start_run, tag, wait_run

pytestmark = pytest.mark.e2e

# Rows wholly on the first screen, and where the first one starts.
ROWS_IN_SIGHT = """() => {
  const rows = Array.from(document.querySelectorAll('#request-rows li.row'))
    .map((r) => r.getBoundingClientRect());
  return { inSight: rows.filter((r) => r.top >= 0 && r.bottom <= innerHeight).length,
           firstTop: rows.length ? Math.round(rows[0].top) : null, height: innerHeight };
}"""

# Every visible text node's WCAG contrast against the background it is drawn on (the
# element's and its ancestors' background colours composited; opacity applied to the text).
# Disabled controls are exempt (WCAG 1.4.3), so are visually hidden texts.
CONTRAST = """() => {
  const parse = (c) => {
    const m = /rgba?\\(([^)]*)\\)/.exec(c || '');
    if (!m) return [0, 0, 0, 0];
    const p = m[1].split(/[\\s,\\/]+/).filter(Boolean).map(Number);
    return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
  };
  const over = (top, under) => {
    const a = top[3] + under[3] * (1 - top[3]);
    if (!a) return [0, 0, 0, 0];
    return [0, 1, 2].map((i) => (top[i] * top[3] + under[i] * under[3] * (1 - top[3])) / a).concat([a]);
  };
  const lum = (c) => {
    const [r, g, b] = c.slice(0, 3).map((v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  const background = (el) => {
    const layers = [];
    for (let e = el; e; e = e.parentElement) layers.push(parse(getComputedStyle(e).backgroundColor));
    const dark = matchMedia('(prefers-color-scheme: dark)').matches;
    let bg = dark ? [18, 18, 18, 1] : [255, 255, 255, 1];
    for (const layer of layers.reverse()) bg = over(layer, bg);
    return bg;
  };
  const seen = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    if (!node.textContent.trim()) continue;
    const el = node.parentElement;
    if (!el || el.closest('option, script, style, .visually-hidden, [disabled], [aria-hidden=true] kbd')) continue;
    const range = document.createRange(); range.selectNodeContents(node);
    const box = range.getBoundingClientRect();
    if (box.width < 2 || box.height < 2 || box.bottom < 0 || box.top > innerHeight) continue;
    const style = getComputedStyle(el);
    if (style.visibility !== 'visible') continue;
    let opacity = 1;
    for (let e = el; e; e = e.parentElement) opacity *= Number(getComputedStyle(e).opacity);
    if (opacity === 0) continue;
    const fg = parse(style.color); fg[3] *= opacity;
    const bg = background(el);
    const shown = over(fg, bg);
    const [hi, lo] = [lum(shown), lum(bg)].sort((a, b) => b - a);
    seen.push({ ratio: Math.round(((hi + 0.05) / (lo + 0.05)) * 100) / 100,
                text: node.textContent.trim().slice(0, 40), where: el.tagName + '.' + el.className });
  }
  seen.sort((a, b) => a.ratio - b.ratio);
  return { count: seen.length, min: seen.length ? seen[0].ratio : null, worst: seen.slice(0, 8) };
}"""


def refunds(api, t: str, n: int, label: str) -> list[int]:
    runs = [start_run(api, f"Refund order D-{k:02d}, ${k} ({label} {t})") for k in range(n)]
    for run_id in runs:
        wait_run(api, run_id, "pending")
    return runs


def test_a_1280_by_800_screen_shows_one_toolbar_row_and_at_least_12_rows(app, api, contexts, shoot):
    t = tag()
    refunds(api, t, 14, "dense")
    page = login(contexts(viewport={"width": 1280, "height": 800}), app, "reviewer")
    open_inbox(page, app, f"q={t}")
    expect(page.locator("#request-rows li.row")).to_have_count(14)
    expect(page.locator("#triage-tools")).to_be_visible()  # inbox-keys.js is running

    # search, the filters' menu, the sort and the chips: one row
    parts = ["#inbox-search", "#filter-box > summary", "#inbox-filters select[name=sort]"]
    parts += ['#inbox-chips a[data-chip="claim=mine"]', "#inbox-chips a.chip:visible >> nth=-1"]
    middles = [
        page.locator(p).evaluate(
            "e => { const r = e.getBoundingClientRect(); return (r.top + r.bottom) / 2; }"
        )
        for p in parts
    ]
    assert max(middles) - min(middles) <= 6, f"the toolbar's parts are not on one row: {middles}"
    expect(page.locator("#inbox-filters select[name=kind]")).to_be_hidden()  # in the menu

    # nothing selected: no bulk buttons, and those there are are disabled
    approve = page.locator("#bulk-form button[value=approve]")
    expect(approve).to_be_hidden()
    expect(approve).to_be_disabled()
    found = page.evaluate(ROWS_IN_SIGHT)
    print(f"\n1280x800: {found['inSight']} rows on the first screen")
    assert found["inSight"] >= 12, found
    # the tool's name is read whole; a long gist is what gives way
    cut = page.evaluate(
        "() => Array.from(document.querySelectorAll('#request-rows .row-main .what'))"
        ".filter((e) => e.scrollWidth > e.clientWidth).length"
    )
    assert cut == 0, f"{cut} rows show their tool's name cut"
    shoot(page, "list", figure=f"1280x800: {found['inSight']} rows on the first screen")
    shoot(page, "list-first-screen", first_screen=True)

    # a selection brings them, enabled and looking so; none again hides them
    page.locator("#request-rows li.row input.row-select").first.check()
    expect(approve).to_be_visible()
    expect(approve).to_be_enabled()
    assert approve.evaluate("b => getComputedStyle(b).opacity") == "1"
    page.locator("#request-rows li.row input.row-select").first.uncheck()
    expect(approve).to_be_hidden()
    expect(approve).to_be_disabled()

    # the menu opens over the list and filters it
    page.locator("#filter-box > summary").click()
    expect(page.locator("#inbox-filters select[name=kind]")).to_be_visible()
    page.select_option("#inbox-filters select[name=state]", "all")
    expect(page).to_have_url(re.compile(r"[?&]state=all"))
    expect(page.locator("#filter-summary")).to_have_text("all states")


def test_a_phone_starts_the_list_in_its_top_third_without_key_hints(app, api, contexts, shoot):
    t = tag()
    refunds(api, t, 4, "thumb")
    _, request_id = halted_run(api, f"Refund order D-99, $99 (thumb {t})")
    touch = contexts(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    page = login(touch, app, "reviewer")
    open_inbox(page, app, f"q={t}")
    expect(page.locator("#request-rows li.row")).to_have_count(5)
    expect(page.locator("#triage-tools")).to_be_visible()
    found = page.evaluate(ROWS_IN_SIGHT)
    print(f"\nphone 390x844: the first row starts at {found['firstTop']} px")
    assert found["firstTop"] <= 844 / 3, found
    expect(page.locator("#triage-tools .keys-link")).to_be_hidden()
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    shoot(page, "phone", figure=f"390x844: first row at {found['firstTop']} px", first_screen=True)

    card = card_of(page, request_id)
    claim = card.page.locator("#detail .claim-toggle")
    expect(claim).to_be_visible()
    expect(claim.locator("kbd")).to_be_hidden()
    expect(card.locator(".key-hint").first).to_be_hidden()

    # with a keyboard and a pointer, at the same width, they show
    desk = login(contexts(viewport={"width": 390, "height": 844}), app, "reviewer")
    open_inbox(desk, app, f"q={t}&r={request_id}")
    expect(desk.locator("#detail .claim-toggle kbd")).to_be_visible()
    expect(desk.locator("#detail .key-hint").first).to_be_visible()


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_every_text_has_at_least_4_5_to_1_contrast(app, api, contexts, shoot, scheme):
    t = tag()
    refunds(api, t, 3, "contrast")
    _, request_id = halted_run(api, f"Refund order D-98, $98 (contrast {t})")
    page = login(
        contexts(viewport={"width": 1280, "height": 800}, color_scheme=scheme), app, "reviewer"
    )
    open_inbox(page, app, f"q={t}")
    expect(page.locator("#triage-tools")).to_be_visible()
    page.locator("#request-rows li.row input.row-select").last.check()  # the bulk bar shows
    expect(page.locator("#bulk-form button[value=approve]")).to_be_visible()
    listed = page.evaluate(CONTRAST)
    figure = f"{scheme}: lowest contrast {listed['min']}:1"
    shoot(page, "list" if scheme == "light" else "dark", figure=figure)

    card_of(page, request_id)
    page.locator("#filter-box > summary").click()  # the menu's labels too
    expect(page.locator("#inbox-filters select[name=kind]")).to_be_visible()
    shown = page.evaluate(CONTRAST)
    figure = f"{scheme}: lowest contrast {shown['min']}:1"
    shoot(page, "detail" if scheme == "light" else "dark-detail", figure=figure)
    print(f"\n{scheme}: lowest contrast {listed['min']} (list), {shown['min']} (detail)")
    for found in (listed, shown):
        assert found["count"] > 40, found
        assert found["min"] >= 4.5, found["worst"]


def test_skip_links_reach_the_list_and_the_requests_actions(app, api, contexts):
    t = tag()
    refunds(api, t, 2, "skip")
    _, request_id = halted_run(api, f"Refund order D-97, $97 (skip {t})")
    page = login(contexts(viewport={"width": 1280, "height": 800}), app, "reviewer")
    open_inbox(page, app, f"q={t}&r={request_id}")
    expect(card_of(page, request_id)).to_be_visible()

    def tab_to(name: str, limit: int = 12) -> None:
        for _ in range(limit):
            page.keyboard.press("Tab")
            if page.evaluate("document.activeElement.textContent.trim()") == name:
                return
        raise AssertionError(f"Tab did not reach {name!r}")

    page.evaluate("document.activeElement && document.activeElement.blur()")
    tab_to("Skip to the requests", 3)
    expect(page.get_by_role("link", name="Skip to the requests")).to_be_visible()
    page.keyboard.press("Enter")
    page.keyboard.press("Tab")
    assert page.evaluate("!!document.activeElement.closest('#request-list')")

    open_inbox(page, app, f"q={t}&r={request_id}")  # Tab from the page's top again
    expect(card_of(page, request_id)).to_be_visible()
    tab_to("Skip to the selected request", 4)
    page.keyboard.press("Enter")
    for _ in range(15):  # the claim bar, then the request's actions
        page.keyboard.press("Tab")
        assert page.evaluate("!!document.activeElement.closest('#detail')")
        if page.evaluate("document.activeElement.matches('button.primary')"):
            break
    else:
        raise AssertionError("Tab from the skip link did not reach the Approve button")
    expect(page.locator("#detail button.primary")).to_be_focused()


def test_the_snooze_minutes_box_and_approve_beside_edit(app, api, contexts, shoot):
    t = tag()
    _, request_id = halted_run(api, f"Refund order D-96, $96 (snooze {t})")
    page = login(contexts(viewport={"width": 1280, "height": 800}), app, "reviewer")
    open_inbox(page, app, f"q={t}&r={request_id}")
    card = card_of(page, request_id)
    form = page.locator("#detail form.snooze")
    minutes = form.locator("input[name=minutes]")
    expect(form.locator("select[name=for]")).to_have_value("1h")
    expect(minutes).to_be_hidden()
    form.locator("select[name=for]").select_option("tomorrow")
    expect(minutes).to_be_hidden()
    form.locator("select[name=for]").select_option("minutes")
    expect(minutes).to_be_visible()
    form.locator("select[name=for]").select_option("1h")
    expect(minutes).to_be_hidden()

    # the Approve button and "Edit arguments before approving" on one line, centred alike
    approve = card.get_by_role("button", name=re.compile(r"^Approve\b"))
    edit = card.locator("details.edit > summary")
    centre = "e => { const r = e.getBoundingClientRect(); return (r.top + r.bottom) / 2; }"
    expect(approve).to_be_visible()
    # measured again while a live redraw of the card (other work on the shared test server)
    # has it out of the layout for a moment
    for _ in range(20):
        a, e = approve.evaluate(centre), edit.evaluate(centre)
        if a > 0 and abs(a - e) <= 2:
            break
        page.wait_for_timeout(100)
    assert abs(a - e) <= 2, f"Approve is centred at {a} px, the edit line at {e} px"


def test_one_confirmation_per_bulk_decision(app, api, contexts, shoot):
    t = tag()
    refunds(api, t, 3, "once")
    page = login(contexts(viewport={"width": 1280, "height": 800}), app, "reviewer")
    open_inbox(page, app, f"q={t}")
    expect(page.locator("#request-rows li.row")).to_have_count(3)
    expect(page.locator("#triage-tools")).to_be_visible()
    page.locator("#bulk-all").check()
    page.get_by_role("button", name="Approve selected").click()
    expect(page.locator("#bulk-result")).to_contain_text("3 of 3 approved.")
    expect(page.locator("#request-rows li.row")).to_have_count(0)

    # a later live toast: the socket's messages come in order, so the bulk's are in by then
    _, later = halted_run(api, f"Refund order D-95, $95 (once {t})")
    expect(row_of(page, later)).to_be_visible()
    api.post(f"/api/requests/{later}/decline", json={"reason": f"later {t}"})
    expect(page.locator("#toasts .toast", has_text=f"later {t}")).to_be_visible()
    texts = page.locator("#toasts .toast").all_inner_texts()
    assert not [x for x in texts if "approved" in x.lower()], texts
    shoot(page, "bulk-once")

    # a toast's text wraps inside its box
    page.evaluate(
        """() => { const p = document.createElement('p'); p.className = 'toast';
        p.textContent = 'A very long toast '.repeat(12) + 'x'.repeat(80);
        document.getElementById('toasts').appendChild(p); }"""
    )
    toast = page.locator("#toasts .toast").last
    fits = toast.evaluate(
        "t => t.scrollWidth <= t.clientWidth + 1 && t.scrollHeight <= t.clientHeight + 1"
    )
    assert fits, "a toast's text overflows its box"


# Where a two-call card's Submit decisions sits: in the page as laid out (px from the page's
# top, not stuck to the screen's bottom), and whether it is in sight now.
TWO_CALL_LAYOUT = """(id) => {
  const card = document.querySelector(`article.card[data-request-id="${id}"]`);
  const submit = card.querySelector('form button[type=submit].primary');
  const seen = submit.getBoundingClientRect();
  const inView = seen.bottom <= innerHeight && seen.top >= 0;
  submit.style.position = 'static';
  const laidOut = Math.round(submit.getBoundingClientRect().top + scrollY);
  submit.style.position = '';
  return { submit: laidOut, submitInView: inView };
}"""


def test_a_two_call_request_on_a_phone_keeps_submit_decisions_near(app, api, contexts, shoot):
    t = tag()
    _, request_id = halted_run(api, f"Refund order D-97, $97 and email both customers ({t})")
    touch = contexts(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    page = login(touch, app, "reviewer")
    open_inbox(page, app, f"q={t}&r={request_id}")
    card = card_of(page, request_id)
    expect(card.locator("fieldset.call-decision")).to_have_count(2)
    found = page.evaluate(TWO_CALL_LAYOUT, request_id)
    print(f"\nphone two-call card: Submit decisions at {found['submit']} px down the page")
    shoot(page, "phone-two-calls", figure=f"Submit decisions at {found['submit']} px")
    # it was 1,450 px down, below every call's reason and result boxes: each box shows now
    # with the choice that uses it, and the button stays in sight while the choices scroll by
    assert found["submit"] <= 1200, found
    for fieldset in card.locator("fieldset.call-decision").all():
        fieldset.evaluate("(el) => el.scrollIntoView({block: 'start'})")
        assert page.evaluate(TWO_CALL_LAYOUT, request_id)["submitInView"], found
    refund = card.locator("fieldset.call-decision").first
    expect(refund.locator("input[name^=reason]")).to_be_hidden()
    refund.locator("input[value=decline]").check()
    expect(refund.locator("input[name^=reason]")).to_be_visible()
    refund.locator("input[value=approve]").check()
    card.locator("fieldset.call-decision").last.locator("input[value=decline]").check()
    card.locator("form button[type=submit].primary").click()
    expect(card.locator(".decided, .outcome").first).to_be_visible()
