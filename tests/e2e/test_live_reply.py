"""The model's reply, live on the run page in a real browser: a reviewer declines with a
reason and reads the model answer it piece by piece, then the stored transcript."""

from __future__ import annotations

import itertools

import pytest
from playwright.sync_api import expect

from .test_inbox import card_of, halted_run, login
from .test_live_record import decline_button, reason_box

pytestmark = pytest.mark.e2e

# Every text the "replying…" entry showed, in order, and whether it said "replying…".
RECORD_REPLIES = """() => {
  window.__replies = [];
  const look = () => {
    const entry = document.getElementById("live-reply");
    const text = entry && !entry.hidden ? entry.querySelector(".text") : null;
    if (!text) return;
    const seen = window.__replies;
    const last = seen[seen.length - 1];
    const now = {text: text.textContent, replying: !!entry.querySelector(".replying")};
    if (!last || last.text !== now.text || last.replying !== now.replying) seen.push(now);
  };
  new MutationObserver(look).observe(document.body, {childList: true, subtree: true, characterData: true});
}"""


def test_a_declined_runs_reply_arrives_word_by_word_on_its_page(app, api, contexts, shoot):
    reason = "amount exceeds refund policy"
    run_id, request_id = halted_run(api, "Refund order A-1001, $250")
    page = login(contexts(), app, "reviewer")
    page.goto(app.url(f"/runs/{run_id}/"))
    expect(page.locator("#live[data-ws-open]")).to_have_count(1)
    page.evaluate(RECORD_REPLIES)

    card = card_of(page, request_id)
    reason_box(card).fill(reason)
    decline_button(card).click()

    final = page.locator("section.final")
    expect(final).to_contain_text(f"the reviewer declined it ({reason})", timeout=20_000)
    shoot(page, "done")
    expect(page.locator("#live-reply")).to_have_count(0)  # the stored transcript took over

    seen = page.evaluate("() => window.__replies")
    texts = [s["text"] for s in seen if s["text"]]
    assert len(texts) >= 3, seen  # in pieces, not all at once
    for shorter, longer in itertools.pairwise(texts):
        assert longer.startswith(shorter), seen
    assert reason not in texts[0]  # the first piece came before the reason was read out
    assert f"the reviewer declined it ({reason})" in texts[-1]
    assert seen[0]["replying"], seen  # said "replying…" while it filled in
    stored = page.locator("li.step-assistant .text").last
    expect(stored).to_contain_text(texts[-1].strip())
