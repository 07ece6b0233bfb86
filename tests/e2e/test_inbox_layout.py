"""The triage inbox's layout in a real browser (issue 14): a compact list and a detail pane,
the selection in the URL (shareable, the back button works), two screens on a phone, who
else is viewing a request, and dark mode. Each test lists only its own requests through
the search box (`q=<tag>`), whatever else the session left pending."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from .test_inbox import card_of, halted_run, login, open_inbox, row_of, start_run, tag, wait_run

pytestmark = pytest.mark.e2e


def selected_in_url(page: Page, request_id: str) -> None:
    expect(page).to_have_url(re.compile(rf"[?&]r={re.escape(request_id)}(&|$)"))


def test_rows_open_in_the_detail_pane_with_the_url_and_the_back_button(app, api, contexts, shoot):
    t = tag()
    _, first = halted_run(api, f"Refund order A-5001, $11 (layout {t})")
    _, second = halted_run(api, f"Refund order A-5002, $12 (layout {t})")
    page = login(contexts(viewport={"width": 1280, "height": 800}), app, "reviewer")
    open_inbox(page, app, f"q={t}")

    # compact rows: agent, tool, the key arguments, age; nothing selected yet
    rows = page.locator("#request-rows li.row")
    expect(rows).to_have_count(2)
    expect(row_of(page, first)).to_contain_text("demo")
    expect(row_of(page, first)).to_contain_text("refund")
    expect(row_of(page, first)).to_contain_text("order A-5001 · amount 11")
    expect(page.locator("#detail")).to_contain_text("Select a request")
    # measured in one step in the page: the socket's snapshot may be swapping the list in
    height = row_of(page, first).evaluate("row => row.getBoundingClientRect().height")
    assert 0 < height < 110, f"a row is {height} px tall"
    assert page.title().startswith("(")  # "(N) Inbox"
    shoot(page, "1-list")

    # a click opens the request beside the list; the URL says which (shareable)
    card = card_of(page, first)
    expect(card).to_be_visible()
    selected_in_url(page, first)
    expect(row_of(page, first)).to_have_attribute("aria-current", "true")
    expect(page.locator("#detail section.history")).to_contain_text("Request created")
    expect(page.locator("#detail .run-summary")).to_contain_text("Transcript")
    expect(page.locator("#request-list")).to_be_visible()  # both panes on a wide screen
    shoot(page, "2-detail")

    card_of(page, second)
    selected_in_url(page, second)
    expect(row_of(page, first)).not_to_have_attribute("aria-current", "true")

    # the back button returns to the previous selection, and again to none
    page.go_back()
    selected_in_url(page, first)
    expect(page.locator(f'#detail article.card[data-request-id="{first}"]')).to_be_visible()
    expect(row_of(page, first)).to_have_attribute("aria-current", "true")
    page.go_back()
    expect(page.locator("#detail article.card")).to_have_count(0)
    expect(page.locator("#detail")).to_contain_text("Select a request")

    # the URL is shareable: a fresh page opens with that request selected
    other = login(contexts(), app, "reviewer2")
    other.goto(app.url(f"/?q={t}&r={second}"))
    expect(other.locator(f'#detail article.card[data-request-id="{second}"]')).to_be_visible()
    expect(row_of(other, second)).to_have_attribute("aria-current", "true")

    # filters and search live in the URL too, with counts
    other.locator("#inbox-search").fill(f"A-5002, $12 (layout {t}")
    expect(other).to_have_url(re.compile(r"[?&]q=A-5002"))
    expect(other.locator("#request-rows li.row")).to_have_count(1)
    expect(other.locator("#request-count")).to_have_attribute("data-count", "1")

    # back after changing filters shows the list and the filters of the URL it returns to
    halted_run(api, f"ask a question (layout {t})")
    other.goto(app.url(f"/?q=layout+{t}"))
    expect(other.locator("#request-rows li.row")).to_have_count(3)
    other.locator("#filter-box > summary").click()  # agent, kind and state: in the menu
    other.select_option("#inbox-filters select[name=kind]", "question")
    expect(other).to_have_url(re.compile(r"[?&]kind=question"))
    expect(other.locator("#request-rows li.row")).to_have_count(1)
    other.select_option("#inbox-filters select[name=sort]", "oldest")
    expect(other).to_have_url(re.compile(r"[?&]sort=oldest"))
    other.select_option("#inbox-filters select[name=state]", "declined")
    expect(other).to_have_url(re.compile(r"[?&]state=declined"))
    expect(other.locator("#request-rows li.row")).to_have_count(0)
    other.go_back()
    expect(other).to_have_url(re.compile(r"kind=question.*sort=oldest|sort=oldest.*kind=question"))
    expect(other.locator("#inbox-filters select[name=sort]")).to_have_value("oldest")
    expect(other.locator("#inbox-filters select[name=kind]")).to_have_value("question")
    expect(other.locator("#inbox-filters select[name=state]")).to_have_value("pending")
    expect(other.locator("#request-rows li.row")).to_have_count(1)
    other.go_back()
    expect(other.locator("#inbox-filters select[name=sort]")).to_have_value("newest")
    expect(other.locator("#request-rows li.row")).to_have_count(1)


def test_the_live_list_follows_filters_changed_without_a_reload(app, api, contexts):
    """The socket opened with the page's first URL; a filter changed since (htmx, no reload)
    decides what arrives live."""
    t = tag()
    halted_run(api, f"ask a question (follow {t})")
    page = login(contexts(), app, "reviewer")
    open_inbox(page, app, f"q=follow+{t}")
    expect(page.locator("#request-rows li.row")).to_have_count(1)
    page.locator("#filter-box > summary").click()  # agent, kind and state: in the menu
    page.select_option("#inbox-filters select[name=kind]", "tool_call")
    expect(page).to_have_url(re.compile(r"[?&]kind=tool_call"))
    expect(page.locator("#request-rows li.row")).to_have_count(0)
    _, refund = halted_run(api, f"Refund order A-6001, $5 (follow {t})")
    expect(row_of(page, refund)).to_be_visible()  # matches the new filter: it arrives
    halted_run(api, f"ask a question (follow {t} again)")
    _, newest = halted_run(api, f"Refund order A-6002, $6 (follow {t})")
    expect(row_of(page, newest)).to_be_visible()
    expect(page.locator("#request-rows li.row")).to_have_count(2)  # no question came in


# Where rows are in the viewport: [top, bottom] each.
ROW_SPANS = """rows => rows.map(r => {
  const b = r.getBoundingClientRect(); return [b.top, b.bottom]; })"""


def test_a_phone_shows_the_list_and_the_request_as_two_screens(app, api, contexts, shoot):
    t = tag()
    older = [halted_run(api, f"Refund order A-510{n}, $3{n} (phone {t})")[1] for n in (2, 3)]
    _, request_id = halted_run(
        api, f"Refund order A-5101, $31 for a very long complaint (phone {t})"
    )
    context = contexts(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    page = login(context, app, "reviewer")
    open_inbox(page, app, f"q={t}")
    expect(row_of(page, request_id)).to_be_visible()
    expect(page.locator("#detail")).to_be_hidden()
    assert page.evaluate("document.documentElement.scrollWidth") <= 390

    # the first screen shows requests: search, sort and chips stay, agent, kind and state
    # fold into the "Filters" menu (its summary says what is on), the bulk buttons wait for a
    # selection
    box = page.locator("#filter-box")
    expect(box).not_to_have_attribute("open", "")
    expect(box.locator("summary")).to_contain_text("Filters")
    expect(page.locator("#filter-summary")).to_have_text("Pending")
    expect(page.locator("#inbox-search")).to_be_visible()
    expect(page.locator("#inbox-filters select[name=sort]")).to_be_visible()
    expect(page.locator("#inbox-filters select[name=kind]")).to_be_hidden()
    expect(page.get_by_role("button", name="Approve selected")).to_be_hidden()
    assert page.evaluate("window.scrollY") == 0
    first, _, third = page.locator("#request-rows li.row").evaluate_all(ROW_SPANS)[:3]
    assert first[0] < 844 / 2, f"the first request starts at {first[0]} px"
    assert third[1] <= 844, f"the third request ends at {third[1]} px, below the first screen"
    shoot(page, "1-phone-list")

    # a selection brings the bulk buttons
    row_of(page, older[0]).locator("input.row-select").check()
    expect(page.get_by_role("button", name="Approve selected")).to_be_visible()
    row_of(page, older[0]).locator("input.row-select").uncheck()

    # the filters open and work as on a wide screen; the URL keeps them, the summary says them
    box.locator("summary").click()
    expect(page.locator("#inbox-filters select[name=kind]")).to_be_visible()
    shoot(page, "1b-phone-filters")
    box.locator("summary").click()  # the menu closed: the sort and chips beside it
    page.select_option("#inbox-filters select[name=sort]", "oldest")
    expect(page).to_have_url(re.compile(r"[?&]sort=oldest"))
    page.locator('#inbox-chips a[data-chip="claim=unclaimed"]').click()
    expect(page).to_have_url(re.compile(r"[?&]claim=unclaimed"))
    expect(page.locator("#filter-summary")).to_have_text("Pending")
    expect(page.locator('#inbox-chips a[data-chip="claim=unclaimed"]')).to_have_attribute(
        "aria-current", "true"
    )
    expect(page.locator("#request-rows li.row")).to_have_count(3)
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    shoot(page, "1c-phone-filtered")

    card = card_of(page, request_id)
    expect(card).to_be_visible()
    expect(page.locator("#request-list")).to_be_hidden()
    expect(page.get_by_role("link", name="Back to list")).to_be_visible()
    wide = page.evaluate(
        "() => Array.from(document.querySelectorAll('body *')).filter(e => e.getBoundingClientRect().right > 391)"
        ".slice(0, 8).map(e => e.tagName + '#' + e.id + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right))"
    )
    assert page.evaluate("document.documentElement.scrollWidth") <= 390, wide
    shoot(page, "2-phone-detail")

    page.go_back()  # the back button is the way back too
    expect(row_of(page, request_id)).to_be_visible()
    expect(page.locator("#detail")).to_be_hidden()


# The toasts in sight, and the controls each one overlaps: those of the open request (its
# claim bar, its decision form) and those of the list (filters, bulk bar, rows' checkboxes).
TOAST_OVERLAPS = """() => {
  const boxes = (els) => Array.from(els).map((el) => [el, el.getBoundingClientRect()])
    .filter(([, r]) => r.width > 0 && r.height > 0);
  const controls = boxes(document.querySelectorAll(
    '#inbox :is(input:not([type=hidden]), textarea, button, select, summary)'));
  const decision = controls.filter(([c]) => c.closest('#detail'));
  const toasts = boxes(document.querySelectorAll('#toasts .toast'));
  const hit = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
  const inView = (r) => r.top >= 0 && r.bottom <= innerHeight && r.left >= 0 && r.right <= innerWidth;
  return { toasts: toasts.length, controls: decision.length,
           inView: toasts.every(([, r]) => inView(r)),
           overlaps: toasts.flatMap(([t, tr]) => controls.filter(([, cr]) => hit(tr, cr))
             .map(([c]) => t.textContent.slice(0, 40) + ' covers ' + c.outerHTML.slice(0, 80))) };
}"""


@pytest.mark.parametrize("width", [1280, 1600])
def test_wide_screens_use_their_width_and_toasts_stay_off_the_request(
    app, api, contexts, shoot, width
):
    t = tag()
    _, request_id = halted_run(api, f"Refund order A-5401, $21 (wide {t})")
    page = login(contexts(viewport={"width": width, "height": 720}), app, "reviewer")
    open_inbox(page, app, f"q={t}&r={request_id}")
    card = page.locator(f'#detail article.card[data-request-id="{request_id}"]')
    expect(card).to_be_visible()
    # search, sort and chips in sight on the toolbar, agent, kind and state behind its menu
    expect(page.locator("#inbox-search")).to_be_visible()
    expect(page.locator("#inbox-filters select[name=sort]")).to_be_visible()
    expect(page.locator("#inbox-chips a.chip").first).to_be_visible()

    # the list and the request use the screen: no column kept for toasts, up to 96rem wide
    used, detail = page.evaluate(
        "() => [document.getElementById('inbox').getBoundingClientRect().width,"
        " document.getElementById('detail').getBoundingClientRect().width]"
    )
    room = page.evaluate("document.documentElement.clientWidth")
    assert used >= min(room, 1536) - 40, f"the inbox uses {used} of {room} px"
    assert detail >= used - 32 * 16 - 24, f"the request gets {detail} of {used} px"
    assert page.evaluate("document.documentElement.scrollWidth") <= width

    # toasts (a request arrives live, another is decided elsewhere) cover no control of the
    # open request, whatever the scroll
    _, other = halted_run(api, f"Refund order A-5402, $22 (wide {t})")
    expect(row_of(page, other)).to_be_visible()
    api.post(f"/api/requests/{other}/decline", json={"reason": f"not now {t}"})
    expect(page.locator("#toasts .toast")).to_have_count(2, timeout=10_000)
    shoot(page, "toasts")
    for scroll in (0, 400):
        page.evaluate("y => window.scrollTo(0, y)", scroll)
        found = page.evaluate(TOAST_OVERLAPS)
        assert found["toasts"] >= 1 and found["controls"] >= 5, found
        assert found["inView"], found
        assert not found["overlaps"], found["overlaps"]
    card.get_by_role("button", name=re.compile(r"^Approve\b")).click(trial=True, timeout=2_000)


# The keyboard's cursor row and the list's last row against the toasts in sight, with the
# scroll and where focus is: measured in one step in the page, so that a live swap cannot
# come in between.
ROWS_UNDER_TOASTS = """() => {
  const toasts = Array.from(document.querySelectorAll('#toasts .toast'))
    .map((t) => t.getBoundingClientRect()).filter((r) => r.width > 0 && r.height > 0);
  const rows = Array.from(document.querySelectorAll('#request-rows li.row'));
  const cursor = document.querySelector('#request-rows li.row.kb-cursor');
  const hit = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
  const where = (row) => {
    if (!row) return null;
    const r = row.getBoundingClientRect();  // a pixel's slack: subpixel layout
    return { top: Math.round(r.top), bottom: Math.round(r.bottom),
             inView: r.top >= -1 && r.bottom <= innerHeight + 1, covered: toasts.some((t) => hit(t, r)) };
  };
  const root = document.documentElement;
  const active = document.activeElement;
  return { toasts: toasts.length, toastsTop: Math.round(Math.min(...toasts.map((t) => t.top))),
           rows: rows.length, at: rows.indexOf(cursor), cursor: where(cursor),
           last: where(rows[rows.length - 1]), height: innerHeight, scrollY: Math.round(scrollY),
           atEnd: Math.ceil(scrollY + innerHeight) >= root.scrollHeight,
           focus: active && active.closest('#detail') ? 'detail' : active ? active.className || active.tagName : null,
           focusedRow: active && rows.indexOf(active.closest('#request-rows li.row')),
           focused: where(active && active.closest('#request-rows li.row')) };
}"""


def walk(page: Page, key: str, until, label: str) -> dict:
    """Press `key` (j or k) until `until(found)`: at each step the cursor row is in sight,
    clear of every toast, and toasts still show (else the test proves nothing)."""
    found = page.evaluate(ROWS_UNDER_TOASTS)
    for step in range(found["rows"] + 2):
        page.keyboard.press(key)
        found = page.evaluate(ROWS_UNDER_TOASTS)
        where = f"{label}, {key} #{step + 1}: {found}"
        assert found["toasts"] >= 1, f"the toasts went before the test ended ({where})"
        assert found["at"] >= 0 and found["cursor"]["inView"], where
        assert not found["cursor"]["covered"], f"the cursor row is under a toast ({where})"
        if until(found):
            return found
    raise AssertionError(f"{label}: {key} never got there: {found}")


def toasts_come(page: Page, api, prompt: str) -> None:
    """Toasts, as in a busy inbox: a request arrives live, and is declined elsewhere."""
    _, other = halted_run(api, prompt)
    expect(row_of(page, other)).to_be_visible()
    reason = f"not now {tag()}"
    api.post(f"/api/requests/{other}/decline", json={"reason": reason})
    expect(row_of(page, other)).to_have_count(0)  # the list shows pending requests
    expect(page.locator("#toasts .toast", has_text=reason)).to_be_visible()


def test_toasts_leave_the_keyboard_cursor_and_the_last_row_in_sight(app, api, contexts, shoot):
    """Issue 14: on a wide screen toasts sit over the bottom of the list pane. While they
    show, the page keeps room for them: j/k never leave the cursor on a row under a toast,
    whether focus is on the page or in the open request, Tab shows the row it reaches clear
    of them, and the last row can be scrolled clear of them; a field of the request taking
    focus does not scroll the list. Without toasts the page keeps no such room."""
    t = tag()
    runs = [start_run(api, f"Refund order A-55{n:02d}, ${n} (room {t})") for n in range(12)]
    for run_id in runs:
        wait_run(api, run_id, "pending")
    page = login(contexts(viewport={"width": 1280, "height": 720}), app, "reviewer")
    open_inbox(page, app, f"q={t}")
    expect(page.locator("#request-rows li.row")).to_have_count(12)
    expect(page.locator("#triage-tools")).to_be_visible()  # inbox-keys.js is running

    # toasts come; the list goes on below the screen
    toasts_come(page, api, f"Refund order A-5599, $99 (room {t})")
    page.evaluate("() => document.activeElement && document.activeElement.blur()")
    found = page.evaluate(ROWS_UNDER_TOASTS)
    assert found["toasts"] == 2 and found["rows"] == 12 and found["scrollY"] == 0, found
    assert found["last"]["bottom"] > found["height"], f"the list fits the screen: {found}"

    # j down to the last row, focus on the page
    last = found["rows"] - 1
    found = walk(page, "j", lambda f: f["at"] == last, "down")
    assert found["scrollY"] > 0 and found["focus"] == "BODY", found
    shoot(page, "1-cursor-at-the-end")

    # scrolled to the bottom, the last row shows above the toasts
    page.evaluate("() => window.scrollTo(0, document.documentElement.scrollHeight)")
    found = page.evaluate(ROWS_UNDER_TOASTS)
    assert found["toasts"] >= 1 and found["atEnd"], found
    assert found["last"]["inView"] and not found["last"]["covered"], found
    shoot(page, "2-scrolled-to-the-end")

    # more toasts; the list at its top, its first rows under them: Tab from the last control
    # above the list to the first row's checkbox and link, which show clear of the toasts
    toasts_come(page, api, f"Refund order A-5598, $98 (room {t})")
    page.evaluate("() => window.scrollTo(0, 0)")
    found = page.evaluate(ROWS_UNDER_TOASTS)
    assert found["toasts"] >= 1 and found["scrollY"] == 0, found
    page.locator("#bulk-all").focus()  # the last control above the rows
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    found = page.evaluate(ROWS_UNDER_TOASTS)
    assert found["focus"] == "row-link" and found["focusedRow"] == 0, found
    assert found["focused"]["inView"] and not found["focused"]["covered"], found
    shoot(page, "3-tab-to-the-first-row")

    # k up to the first row, which opens: focus goes to the request
    walk(page, "k", lambda f: f["at"] == 0, "up")
    page.keyboard.press("Enter")
    card = page.locator("#detail article.card")
    expect(card).to_be_focused()

    # d goes to the decline reason in the request's pane (sticky, never under the toasts):
    # the list stays where it was
    page.evaluate("() => window.scrollTo(0, 0)")
    page.keyboard.press("d")
    expect(card.locator("textarea[name=reason]")).to_be_focused()
    found = page.evaluate(ROWS_UNDER_TOASTS)
    assert found["scrollY"] == 0 and found["focus"] == "detail", found
    page.keyboard.press("Escape")
    expect(card).to_be_focused()

    # j down to the last row again, focus in the request's pane
    found = walk(page, "j", lambda f: f["at"] == last, "down from the request")
    # each j opened the row it reached; focus is on the last one once it has loaded (a
    # swap replaces the pane, and the card takes focus when it settles)
    last_id = page.locator("#request-rows li.row").nth(last).get_attribute("data-request-id")
    expect(page.locator(f"#detail article.card[data-request-id='{last_id}']")).to_be_focused()
    found = page.evaluate(ROWS_UNDER_TOASTS)
    assert found["scrollY"] > 0 and found["focus"] == "detail", found
    shoot(page, "4-cursor-at-the-end-from-the-request")

    # no toast, no room kept: the page ends with the list as before
    room = page.evaluate(
        """() => {
          const kept = () => [
            getComputedStyle(document.documentElement).scrollPaddingBottom,
            getComputedStyle(document.querySelector('.list-pane')).paddingBottom,
            getComputedStyle(document.querySelector('#request-rows li.row')).scrollMarginBottom];
          const shown = kept();
          document.querySelectorAll('#toasts .toast').forEach((t) => t.remove());
          return [shown, kept()];
        }"""
    )
    assert room[1] == ["auto", "0px", "0px"], room


def test_reviewers_see_who_else_is_viewing_a_request(app, api, contexts, shoot):
    t = tag()
    _, request_id = halted_run(api, f"Refund order A-5201, $41 (presence {t})")
    _, elsewhere = halted_run(api, f"Refund order A-5202, $42 (presence {t})")
    page_a = login(contexts(), app, "reviewer")
    page_b = login(contexts(), app, "reviewer2")
    open_inbox(page_a, app, f"q={t}")
    open_inbox(page_b, app, f"q={t}")

    card_of(page_a, request_id)
    presence_a = page_a.locator("#detail .presence")
    card_of(page_b, request_id)
    expect(presence_a).to_have_text("(reviewer2 is viewing)", timeout=10_000)
    expect(page_b.locator("#detail .presence")).to_have_text("(reviewer is viewing)")
    shoot(page_a, "viewing")

    # B moves on: A's line empties, live
    card_of(page_b, elsewhere)
    expect(presence_a).to_have_text("", timeout=10_000)
    # B comes back through a shared link (the socket is told at connect)
    page_b.goto(app.url(f"/?q={t}&r={request_id}"))
    expect(presence_a).to_have_text("(reviewer2 is viewing)", timeout=10_000)
    page_b.close()  # the tab closes: the name goes
    expect(presence_a).to_have_text("", timeout=10_000)

    # The request's own page (a notification's link) is live too: B there, A in the inbox
    page_c = login(contexts(), app, "reviewer2")
    page_c.goto(app.url(f"/requests/{request_id}/"))
    expect(page_c.locator("#live")).to_have_text("live", timeout=10_000)
    expect(presence_a).to_have_text("(reviewer2 is viewing)", timeout=10_000)
    expect(page_c.locator("#detail .presence")).to_have_text("(reviewer is viewing)")
    # A declines: B's page shows the decision without a reload
    card_a = card_of(page_a, request_id)
    card_a.locator("textarea[name=reason]").fill(f"not this one {t}")
    card_a.get_by_role("button", name=re.compile(r"^Decline(?! all)\b")).click()
    expect(page_c.locator("article.card.state-declined")).to_be_visible(timeout=10_000)
    expect(page_c.locator("#toasts")).to_contain_text("Already declined by reviewer")


def test_dark_mode_follows_the_system_setting(app, api, contexts, shoot):
    t = tag()
    _, request_id = halted_run(api, f"Refund order A-5301, $51 (dark {t})")
    page = login(contexts(color_scheme="dark"), app, "reviewer")
    open_inbox(page, app, f"q={t}")
    card = card_of(page, request_id)
    expect(card).to_be_visible()

    def luminance(selector: str) -> float:
        rgb = page.evaluate(
            "s => getComputedStyle(document.querySelector(s)).backgroundColor", selector
        )
        r, g, b = (int(x) for x in re.findall(r"\d+", rgb)[:3])
        return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255

    assert luminance("body") < 0.2
    assert luminance("#detail article.card") < 0.2
    color = page.evaluate("getComputedStyle(document.body).color")
    assert sum(int(x) for x in re.findall(r"\d+", color)[:3]) > 500  # light text
    shoot(page, "dark")

    page.emulate_media(color_scheme="light")
    assert luminance("body") > 0.8
