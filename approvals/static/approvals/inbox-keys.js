// The triage inbox from the keyboard, bulk selection, claims, and alerts (issue 14).
// Every page works without this file; it only adds:
// - keys (the list is in #keys-help, "?"): j/k move the cursor over the rows (and open the
//   row reached while a request is open, unless the open one holds typed text), Enter opens,
//   a approves (every call of a multi-call card, as its form stands by default; or goes to
//   the typed result a request needs), d goes to the decline reason
//   (Enter sends it, Shift+Enter is a new line), e edits the arguments, r goes to the typed
//   result or answer the card marks (data-respond: where the service takes one; a question's
//   typed answer, its "Other" chosen, before its options), never to the
//   decline reason: a request that takes none says so in a toast; c claims / releases
//   (from the list, the row shows it loading), x selects for a bulk decision, / searches,
//   ? lists the keys, Esc closes the list or leaves a text field. Keys never fire while
//   typing in a field. After a decision the next request opens by itself: clearing a queue
//   takes one key per approval. A key acts on the form or button in the page when it acts
//   (a swap may have replaced the one in the page when it was pressed); each c press is one
//   claim or release, in order;
// - bulk selection: shift-click selects a range of checkboxes; the selection survives live
//   updates of the list, and so does "all matching" while the list's filters stay the same
//   (the search box's change on blur reloads the list: a click on "all matching" after typing
//   a search is kept);
// - taking over: deciding a request another reviewer claimed asks first (the claim bar,
//   #claim-bar-<pk>[data-claimed-by], says who holds it) and posts `takeover=1`;
// - the page title "(N) Inbox" from #request-count[data-pending] (else [data-count]);
// - opt-in browser notifications (the Notification API) for requests that arrive live while
//   the tab is hidden (a click on one opens its request: `?r=<id>`), and an opt-in beep
//   (WebAudio, no file), both kept in localStorage;
// - a phone: the filters' disclosure closes (its summary says what is on).
// It opens requests through app.js's window.toolnexusInbox.select (else a row's link) and
// leaves opening the next one after a decision to app.js when it says so
// (`advancesAfterDecision`). The triage views answer with HX-Trigger events it handles:
// toolnexus:bulk-done, toolnexus:hidden, toolnexus:unhidden, toolnexus:claimed.
(function () {
  "use strict";

  var NOTIFY_KEY = "toolnexus.notify";
  var SOUND_KEY = "toolnexus.sound";
  var cursorId = null;      // request id of the row the keyboard cursor is on
  var selected = {};        // request id -> true: rows checked for a bulk decision
  var lastChecked = null;   // request id of the last checkbox clicked (shift-click ranges)
  var allFor = null;        // "all matching" is checked for: {filters, upto} (see filtersOf)
  var grewFor = null;       // ...was unchecked as requests arrived, for these filters
  var seen = {};            // request ids of rows this page has shown (new arrivals: the rest)
  var inLive = false;
  var detailLoading = false;
  var loads = 0;            // counts the detail loads this script asked for
  var queued = null;        // a key's action waiting for the opened request to load
  var opening = null;       // request id of the row the keys asked to open, until it shows
  var openingXhr = null;    // ...and the load bringing it (one it replaced may fail first)
  var decidingIndex = -1;   // the cursor's row index when a decision was sent
  var viewer = "";

  function $(sel, root) { return (root || document).querySelector(sel); }
  function $$(sel, root) { return Array.prototype.slice.call((root || document).querySelectorAll(sel)); }
  function textOf(el) { return el ? el.textContent.replace(/\s+/g, " ").trim() : ""; }

  function rows() { return $$("#request-rows li.row"); }
  function rowById(id) {
    return rows().filter(function (r) { return r.dataset.requestId === id; })[0] || null;
  }
  function detailCard() { return $("#detail article.card"); }
  function openId() {
    var card = detailCard();
    if (card && card.dataset.requestId) return card.dataset.requestId;
    var current = $('#request-rows li.row[aria-current="true"]');
    if (current) return current.dataset.requestId;
    var inbox = document.getElementById("inbox");
    return (inbox && inbox.dataset.selected) || null;
  }

  function appUrl(path) {
    var frame = $(".approvals-app");
    return ((frame && frame.dataset.appRoot) || "/") + path;
  }

  function findViewer() {
    if (viewer) return viewer;
    var el = $("[data-viewer]:not([data-viewer=''])");
    viewer = (el && el.dataset.viewer) || textOf($(".approvals-app .who span"));
    return viewer;
  }

  // -- the cursor -----------------------------------------------------------------------

  function cursorRow() {
    return (cursorId && rowById(cursorId)) || (openId() && rowById(openId())) || rows()[0] || null;
  }

  function setCursor(row, scroll) {
    $$("#request-rows li.row.kb-cursor").forEach(function (r) { if (r !== row) r.classList.remove("kb-cursor"); });
    if (!row) { cursorId = null; return; }
    row.classList.add("kb-cursor");
    cursorId = row.dataset.requestId;
    if (scroll !== false) row.scrollIntoView({ block: "nearest" });
  }

  // j / k: the cursor moves one row; while a request is open, the row it reaches opens too
  // (triage as Linear's and Gmail's: one key per request passed). An open request the
  // reviewer typed or chose something in stays open: the cursor alone moves, and a note says
  // how to open the row (Enter) once what was typed is sent or no longer wanted.
  function move(step) {
    queued = null;  // a field key pressed before is forgotten once the cursor moves
    var list = rows();
    if (!list.length) return;
    var at = list.indexOf(cursorRow());
    var next = list[Math.max(0, Math.min(list.length - 1, at < 0 ? 0 : at + step))];
    setCursor(next);
    var card = detailCard();
    if (!card || next.dataset.requestId === openId()) return;
    if (card.dataset.dirty || card.dataset.deciding || $("details.edit[open]", card)) {
      say("The open request keeps what you typed: press Enter to open the row under the cursor.");
      return;
    }
    openRow(next);
  }

  function openRow(row) {
    if (!row) return;
    setCursor(row);
    if (row.dataset.requestId === openId() && detailCard()) return;
    if (detailLoading && opening === row.dataset.requestId) return;  // on its way already
    var api = window.toolnexusInbox;
    detailLoading = true;
    opening = row.dataset.requestId;
    openingXhr = null;  // the load of a row j/k passed is not this one's: its abort changes nothing
    var mine = ++loads;
    setTimeout(function () { if (mine === loads && detailLoading) { detailLoading = false; opening = null; runQueued(); } }, 5000);
    if (api && typeof api.select === "function") { api.select(row.dataset.requestId); return; }
    var link = $("a.row-link", row);
    if (link) link.click();
  }

  // Approving acts only on the request the reviewer sees: with the cursor on another row,
  // a opens that one (a second a approves it); while a request loads, a says to wait.
  function approveKey() {
    if (detailLoading) { say("The request is still opening: press a again once it shows."); return; }
    var row = cursorRow();
    if (row && row.dataset.requestId !== openId()) { openRow(row); return; }
    var card = detailCard();
    if (!card) return;
    approve(card);
  }

  // A key that goes to a field of the open request (d, e, r): if the cursor is on another
  // row, open that one first and go to the field once it has loaded.
  function onOpen(action) {
    var row = cursorRow();
    if (row && row.dataset.requestId !== openId()) {
      queued = action;
      openRow(row);
      return;
    }
    if (detailLoading || !detailCard()) { queued = action; return; }
    action(detailCard());
  }

  function runQueued() {
    if (!queued || detailLoading) return;
    var card = detailCard();
    if (!card || card.dataset.requestId !== (cursorId || card.dataset.requestId)) return;
    var action = queued;
    queued = null;
    action(card);
  }

  // The next row after a decision: the row now where the decided one was, else the one
  // before; never the decided one.
  function advance(decidedId) {
    var list = rows().filter(function (r) { return r.dataset.requestId !== decidedId && !r.classList.contains("kb-gone"); });
    if (!list.length) { setCursor(null); return; }
    var at = decidingIndex >= 0 ? decidingIndex : 0;
    openRow(list[Math.min(at, list.length - 1)]);
  }

  // -- what the keys do on the open request ------------------------------------------------

  function focusEnd(el) {
    if (!el) return false;
    el.focus();
    try { if (typeof el.value === "string" && el.setSelectionRange) el.setSelectionRange(el.value.length, el.value.length); } catch (err) { /* not a text field */ }
    return true;
  }

  function approveForm(card) {
    return $("form.approve", card) || $$("form", card).filter(function (f) {
      return /\/approve\/$/.test(f.getAttribute("action") || "") && !f.closest("details");
    })[0] || null;
  }

  // The typed result or answer of the open request: the field the card marks (data-respond:
  // a relay call's result where the service takes one, or an answer form, whose first field
  // it is); null when the request takes none.
  function answerField(card) {
    var el = $("[data-respond]", card);
    if (el && el.tagName === "FORM") el = $("input:not([type=hidden]), textarea, select", el);
    return el || null;
  }

  function reasonBox(card) { return $("form.decline textarea[name=reason]", card); }

  // htmx has not wired a freshly swapped form until it settles: a submit before that would
  // post the plain form (a full page load). Such an action waits for the settle.
  function wired(form) {
    return !!form && !(form.hasAttribute("hx-post") && !form["htmx-internal-data"]);
  }

  // A key's action on a form or button runs on the one in the document at the moment it
  // acts, never on one it found earlier: a swap (a live update, a claim-bar refresh, the
  // answer of a request) may have detached that one in between, and a click or submit on a
  // detached form does nothing ("Form submission canceled because the form is not
  // connected"), or worse, htmx wires the detached copy when its settle runs. `find()` runs
  // again on every try (every 20 ms, up to 10 s): it gives the element to act on, null to
  // wait (a swap or a request is in flight), or false to give up (nothing to do any more).
  // `act` runs at most once; `after` always runs once, when it acted or gave up.
  function actOnCurrent(find, act, after) {
    var until = Date.now() + 10000;
    (function attempt() {
      var el = find();
      var form = el && (el.tagName === "FORM" ? el : el.form);
      if (el && el.isConnected && form && form.isConnected && wired(form)) {
        act(el);
        if (after) after();
        return;
      }
      if (el === false || Date.now() > until) { if (after) after(); return; }
      setTimeout(attempt, 20);
    })();
  }

  function currentCard(id) {
    return $('#detail article.card[data-request-id="' + CSS.escape(id) + '"]');
  }

  // Requests in flight that will swap a claim bar (its claim, release, snooze... forms, or a
  // refresh after a live update): a claim key waits for them, then acts on the new bar.
  var barRequests = [];
  document.addEventListener("htmx:beforeSend", function (e) {
    var d = e.detail, t = d && d.target, xhr = d && d.xhr;
    var bar = t && t.closest ? t.closest(".claim-bar") : null;
    if (!bar || !xhr) return;
    var entry = { xhr: xhr, id: bar.dataset.requestId, at: Date.now() };
    barRequests.push(entry);
    // loadend comes after htmx's onload handler has swapped the answer in
    xhr.addEventListener("loadend", function () {
      barRequests = barRequests.filter(function (b) { return b !== entry; });
    });
  });
  function barBusy(id) {
    var now = Date.now();
    barRequests = barRequests.filter(function (b) { return now - b.at < 20000; });
    return barRequests.some(function (b) { return b.id === id; });
  }

  function approve(card) {
    if (card.dataset.deciding) return;  // a decision on it is on its way: never a second one
    if (!approveForm(card)) {
      var calls = callsForm(card);
      if (calls) approveCalls(card, calls);
      else if (focusEnd(answerField(card))) {
        // a has nothing to approve here: say so, where the answer goes and how it is sent
        say("This request needs an answer, not an approval: give it here, then press Enter (or decline it with d).");
      } else say("Nothing to approve here: this request is decided or takes no approval.");
      return;
    }
    // decided meanwhile: no approve form any more
    submitOnCurrent(card, function (now) { return approveForm(now) || false; });
  }

  // Submits the form `pick(card)` gives on the request's card in the page when it acts (see
  // actOnCurrent): nothing when another request opened or a decision on it is on its way.
  function submitOnCurrent(card, pick) {
    var id = card.dataset.requestId;
    actOnCurrent(function () {
      var now = currentCard(id);
      if (!now) return detailLoading ? null : false;  // another request opened: nothing to do
      if (now.dataset.deciding) return false;
      return pick(now);
    }, submit);
  }

  // a on a multi-call card approves every call: it sends the form when each call is still
  // set to "Approve" (the default where the host runs it) and nothing is typed in it. A choice
  // or text the reviewer put in the form is theirs to send: a says how, focuses the form's
  // button, and sends nothing. Else a call the host does not run needs its result: a goes
  // there, as on a single call.
  function callsState(calls) {
    var typed = $$("input[name]:not([type=hidden]):not([type=radio]), textarea[name]", calls)
      .some(function (el) { return el.value.trim() !== ""; });
    var moved = $$("input[type=radio]", calls).some(function (r) { return r.checked !== r.defaultChecked; });
    if (typed || moved) return "changed";
    var boxes = $$("fieldset.call-decision", calls);
    return boxes.some(function (box) { return !$('input[type=radio][value="approve"]', box); })
      ? "needs a result" : "approve all";
  }

  function approveCalls(card, calls) {
    var state = callsState(calls);
    if (state === "needs a result") {  // the first such call: its result, chosen
      var box = $$("fieldset.call-decision", calls).filter(function (b) {
        return !$('input[type=radio][value="approve"]', b);
      })[0];
      var output = $('input[type=radio][value="output"]', box);
      if (output) output.checked = true;
      focusEnd($('textarea[name^="output."], input[name^="output."]', box) || output);
      return;
    }
    var button = $("button[type=submit]", calls);
    if (state === "changed") {
      var send = "“" + (shownText(button) || "the form's button") + "”";
      say("You changed this form (a decision or a text): press " + send + " to send it as it is.");
      if (button) button.focus();
      return;
    }
    submitOnCurrent(card, function (now) {
      var form = callsForm(now);  // decided meanwhile: none; changed meanwhile: not a's to send
      return form && callsState(form) === "approve all" ? form : false;
    });
  }

  function submit(form) {
    if (typeof form.requestSubmit === "function") form.requestSubmit();
    else form.dispatchEvent(new Event("submit", { bubbles: true, cancelable: true }));
  }

  // Enter in a reason or result field sends its form: the form in the document when it
  // sends (a swap may have replaced the card; what was typed goes with it).
  function sendField(field) {
    var form = field.form, card = form.closest("article.card");
    var id = card && card.dataset.requestId, action = form.getAttribute("action");
    var typed = {};
    $$("textarea[name], input[name]:not([type=hidden])", form).forEach(function (el) { typed[el.name] = el.value; });
    actOnCurrent(function () {
      if (form.isConnected) return form.closest("article.card[data-deciding]") ? false : form;
      var now = id && currentCard(id);
      if (!now) return detailLoading ? null : false;
      if (now.dataset.deciding) return false;
      var again = $$("form", now).filter(function (f) { return f.getAttribute("action") === action; })[0];
      if (!again) return false;  // decided meanwhile
      Object.keys(typed).forEach(function (name) {
        var el = again.querySelector('[name="' + CSS.escape(name) + '"]');
        if (el && !el.value) el.value = typed[name];
      });
      return again;
    }, submit);
  }

  function decline(card) { focusEnd(reasonBox(card)); }

  function edit(card) {
    var details = $("details.edit", card);
    if (!details) return;
    details.open = true;
    focusEnd($("input:not([type=hidden]), textarea, select", details));
  }

  // The multi-call form (one decision per call, sent together), or null.
  function callsForm(card) {
    return $$("form", card).filter(function (f) { return /\/calls\/$/.test(f.getAttribute("action") || ""); })[0] || null;
  }

  // A button's text as the card shows it: not what only a screen reader or the key hints add.
  function shownText(el) {
    if (!el) return "";
    var copy = el.cloneNode(true);
    $$(".visually-hidden, .key-hint", copy).forEach(function (x) { x.remove(); });
    return textOf(copy);
  }

  // r: the typed result or answer, never the decline reason (Enter there declines). In the
  // multi-call form it picks that call's "Return this result". A request that takes no typed
  // result says so (a multi-call card: how to send its form) and stays as it was.
  function respond(card) {
    var field = answerField(card);
    if (!field) {
      var calls = approveForm(card) ? null : callsForm(card);
      if (calls) {  // no approve form: each call is decided in the form (a approves them all)
        var send = shownText($("button[type=submit]", calls)) || "the form's button";
        say("No call here takes a typed result: choose each call's decision, then press “" + send + "”.");
      } else if ($(".actions", card)) say("This request takes no typed result: approve it (a) or decline it (d).");
      return;
    }
    // a question's form: the first box to type an answer in (its "Other", chosen with it)
    if (field.form && field.form.hasAttribute("data-respond")) field = $("[data-answer-text]", field.form) || field;
    var box = field.closest("fieldset");
    var choice = box && box.querySelector('input[type=radio][name^="decision."][value="output"], input[type=radio][data-other]');
    if (choice) choice.checked = true;
    focusEnd(field);
  }

  // A short note from a key, in the page's toasts (a polite live region); it goes by itself.
  function say(text) {
    var toasts = document.getElementById("toasts");
    if (!toasts) return;
    $$(".toast.keys-note", toasts).forEach(function (t) { t.remove(); });
    var note = document.createElement("p");
    note.className = "toast keys-note";
    note.setAttribute("role", "status");
    note.dataset.timer = "1";  // not one of app.js's timed toasts: this one times itself
    note.textContent = text;
    toasts.appendChild(note);
    setTimeout(function () { note.remove(); }, 8000);
  }

  function claimBar(id) { return $('.claim-bar[data-request-id="' + CSS.escape(id) + '"]'); }

  // c claims or releases through the claim bar's button. Every press is one toggle, in
  // order: a press waits while a request that swaps the bar is in flight (the previous c's
  // claim, a refresh after a live update), then clicks the button of the bar in the
  // document then (a click on a detached copy would be lost).
  var claimKeys = [];  // request ids of c presses not acted on yet, oldest first
  var claiming = {};   // request id -> true: claimed from the list, the answer not back yet
  function claim() {
    var row = cursorRow();
    var id = row ? row.dataset.requestId : openId();
    if (!id) return;
    if (!claimBar(id) && !claimKeys.length) {  // a row that is not open: claim it from the list
      if (!window.htmx) return;
      // The row shows its claim on the way (is-claiming) until the answer, also when a live
      // update redraws the row meanwhile (syncSelection marks the new one).
      claiming[id] = true;
      if (row) row.classList.add("is-claiming");
      var done = function () {
        delete claiming[id];
        var now = rowById(id);
        if (now) now.classList.remove("is-claiming");
      };
      htmx.ajax("POST", appUrl("requests/" + encodeURIComponent(id) + "/claim/"), { source: row || document.body, swap: "none" }).then(done, done);
      return;
    }
    claimKeys.push(id);
    if (claimKeys.length === 1) nextClaim();
  }

  function nextClaim() {
    if (!claimKeys.length) return;
    var id = claimKeys[0];
    actOnCurrent(function () {
      var bar = claimBar(id);
      if (!bar) return detailLoading ? null : false;
      if (barBusy(id)) return null;
      var button = $("button.claim-toggle", bar);
      if (!button) return false;  // no longer pending, or not this reviewer's to claim
      return button.disabled ? null : button;
    }, function (button) {
      button.click();
    }, function () {
      claimKeys.shift();
      nextClaim();
    });
  }

  function toggleSelect() {
    var row = cursorRow();
    var box = row && $("input.row-select", row);
    if (box) box.click();
  }

  function search() {
    var box = document.getElementById("inbox-search");
    if (box) { box.focus(); if (box.select) box.select(); }
  }

  function help() {
    var dialog = document.getElementById("keys-help");
    if (dialog && !dialog.open && dialog.showModal) dialog.showModal();
  }

  // -- the key handler ------------------------------------------------------------------------

  function isTyping(el) {
    if (!el || el === document.body) return false;
    if (el.isContentEditable) return true;
    if (el.tagName === "TEXTAREA" || el.tagName === "SELECT") return true;
    if (el.tagName !== "INPUT") return false;
    return !/^(checkbox|radio|button|submit|reset|image|hidden|range|color|file)$/.test(el.type);
  }

  function isControl(el) {
    return !!(el && el.closest && el.closest("a[href], button, summary, input, select, textarea, label"));
  }

  // Enter sends a decline reason or a typed result; Shift+Enter is a new line.
  function sendsOnEnter(el) {
    return el.tagName === "TEXTAREA" && !!el.closest("#detail article.card") &&
      (el.name === "reason" || el.name === "output" || el.name.indexOf("output.") === 0) &&
      !!el.form && !el.form.querySelector('input[type=radio][name^="decision."]');
  }

  var ACTIONS = {
    j: function () { move(1); },
    k: function () { move(-1); },
    a: approveKey,
    d: function () { onOpen(decline); },
    e: function () { onOpen(edit); },
    r: function () { onOpen(respond); },
    c: claim,
    x: toggleSelect,
    "/": search,
    "?": help,
  };

  document.addEventListener("keydown", function (e) {
    if (!document.getElementById("inbox") || e.defaultPrevented || e.isComposing) return;
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    var target = e.target;
    var dialog = document.getElementById("keys-help");
    if (dialog && dialog.open) return;  // the dialog's own keys (Esc closes it)
    if (isTyping(target)) {
      if (e.key === "Escape") {
        target.blur();
        var card = detailCard();
        if (card) { if (!card.hasAttribute("tabindex")) card.setAttribute("tabindex", "-1"); card.focus({ preventScroll: true }); }
        e.preventDefault();
      } else if (e.key === "Enter" && !e.shiftKey && sendsOnEnter(target)) {
        e.preventDefault();
        sendField(target);
      }
      return;
    }
    if (e.key === "Enter") {
      if (isControl(target)) return;  // a link or button: Enter activates it as usual
      e.preventDefault();
      openRow(cursorRow());
      return;
    }
    if (e.key === "Escape") {
      var result = document.getElementById("bulk-result");
      if (result && result.firstElementChild) result.textContent = "";
      return;
    }
    var action = ACTIONS[e.key];
    if (!action) return;
    e.preventDefault();
    action();
  });

  // -- bulk selection ---------------------------------------------------------------------------

  // The filters "all matching" posts: the bulk form's hidden fields (the list's query), less
  // `upto`, the newest request (pk) they matched when the list was drawn (uptoOf), and
  // `drawn`, the moment it was drawn (drawnInput), which a list drawn again changes.
  function filtersOf(form) {
    var cut = { csrfmiddlewaretoken: 1, upto: 1, drawn: 1, snapshot: 1 };
    return form ? $$("input[type=hidden]", form).filter(function (i) { return !cut[i.name]; })
      .map(function (i) { return i.name + "=" + i.value; }).join("&") : "";
  }
  function uptoOf(form) {
    var input = form && form.querySelector("input[type=hidden][name=upto]");
    return input && /^\d+$/.test(input.value) ? Number(input.value) : NaN;
  }
  function drawnInput(form) { return form && form.querySelector("input[type=hidden][name=drawn]"); }
  function allChoice(form) {
    var drawn = drawnInput(form);
    return { filters: filtersOf(form), upto: uptoOf(form), drawn: drawn ? drawn.value : null };
  }
  // The newest request (pk) the list shows: a live update puts a new one on top of the list
  // without drawing its bulk bar again, whose `upto` is then older than it.
  function newestShown() {
    return rows().reduce(function (most, r) {
      var pk = /^row-(\d+)$/.exec(r.id || "");
      return pk ? Math.max(most, Number(pk[1])) : most;
    }, 0);
  }
  // Whether the bulk bar is still the one "all matching" was ticked on (its list not drawn
  // again yet).
  function drawnIsOld(form) { return !!(allFor && allFor.bar && allFor.bar === form); }
  // The list again at the page's own URL (filters, page and selection kept): its bulk bar too.
  function reloadList() {
    if (window.htmx && document.getElementById("request-list")) {
      htmx.ajax("GET", location.pathname + location.search, { target: "#request-list", swap: "outerHTML" });
    }
  }

  function syncSelection() {
    var present = {};
    rows().forEach(function (row) {
      var box = $("input.row-select", row);
      var id = row.dataset.requestId;
      present[id] = true;
      if (box) box.checked = !!selected[id];
      row.classList.toggle("is-selected", !!selected[id]);
      row.classList.toggle("is-claiming", !!claiming[id]);
    });
    Object.keys(selected).forEach(function (id) { if (!present[id]) delete selected[id]; });
    var count = document.getElementById("bulk-count");
    var all = document.getElementById("bulk-all");
    if (!count) return;
    var n = Object.keys(selected).length;
    var form = document.getElementById("bulk-form");
    // The list again (a live update, the same search reloaded): its new bulk bar comes
    // unchecked; "all matching" stays chosen for the same filters, never for other ones, and
    // only while no request arrived that they match (a newer `upto`; a lower one: some were
    // decided or left the list). After one arrived the reviewer chooses it again, having seen
    // the list it now means: the server never decides past the `upto` the form posts.
    // Chosen again, it keeps the moment of the list it was chosen on: what re-entered the
    // filters since (a snooze or claim that lapsed) is not taken without the reviewer
    // choosing again.
    if (all && allFor !== null && !all.checked) {
      var drawn = allChoice(form);
      if (drawn.filters === allFor.filters && drawn.upto <= allFor.upto) {
        all.checked = true;
        var moment = drawnInput(form);
        if (moment && allFor.drawn) moment.value = allFor.drawn;
      } else { grewFor = drawn.filters === allFor.filters ? drawn.filters : null; allFor = null; }
    }
    // A request arrived live while "all matching" was checked (a row newer than the bar's
    // `upto`, and than what was on screen when it was checked): unchecked, and the list drawn
    // again, with a bar for the rows it now shows.
    if (all && all.checked && newestShown() > uptoOf(form) && !(allFor && allFor.upto >= newestShown())) {
      all.checked = false;
      grewFor = filtersOf(form);
      allFor = null;
      reloadList();
    }
    if (all && all.checked) grewFor = null;
    // The snapshot of "all matching" (#bulk-snapshot, kept through redraws) goes with it.
    var snapshot = document.getElementById("bulk-snapshot");
    if (snapshot && all && !all.checked && snapshot.firstChild) snapshot.textContent = "";
    // Ticked while newer rows were on screen: the list was drawn again for them, and the
    // snapshot is taken again on it (with its `upto`), now that it is back.
    if (all && all.checked && allFor && allFor.retake && !drawnIsOld(form)) {
      allFor.retake = false;
      htmx.trigger(all, "change");
    }
    var chosen = n > 0 || !!(all && all.checked);
    if (form) form.classList.toggle("has-selection", chosen);
    // Nothing chosen: the bulk buttons are hidden (app.css) and disabled, never enabled-looking-disabled.
    if (form) $$("button[name=action]", form).forEach(function (b) { b.disabled = !chosen; });
    if (all && all.checked) count.textContent = "All matching requests selected";
    else if (n) count.textContent = n + " selected";
    else if (grewFor !== null && grewFor === filtersOf(form)) count.textContent = "New requests arrived: choose all matching again";
    else count.textContent = "";
  }

  document.addEventListener("click", function (e) {
    var box = e.target;
    if (!box.matches || !box.matches("input.row-select")) return;
    var row = box.closest("li.row");
    if (!row) return;
    var id = row.dataset.requestId;
    if (e.shiftKey && lastChecked && lastChecked !== id) {
      var list = rows(), from = list.indexOf(rowById(lastChecked)), to = list.indexOf(row);
      if (from >= 0 && to >= 0) {
        list.slice(Math.min(from, to), Math.max(from, to) + 1).forEach(function (r) {
          if (box.checked) selected[r.dataset.requestId] = true;
          else delete selected[r.dataset.requestId];
        });
      }
    }
    if (box.checked) selected[id] = true; else delete selected[id];
    lastChecked = id;
    setCursor(row, false);
    syncSelection();
  });

  document.addEventListener("change", function (e) {
    var el = e.target;
    if (el.id === "bulk-all") {
      grewFor = null;
      allFor = el.checked ? allChoice(el.form) : null;
      // Checked while the list shows a request newer than its bar (it arrived live): the bar
      // is drawn again, and stays checked if nothing newer than those rows arrived meanwhile.
      if (allFor && newestShown() > allFor.upto) {
        allFor.upto = newestShown();
        allFor.retake = true;
        allFor.bar = el.form;
        reloadList();
      }
      syncSelection();
    }
    if (el.matches && el.matches(".snooze select[name=for]") && el.value === "minutes") {
      var minutes = el.form && el.form.querySelector("input[name=minutes]");
      if (minutes) minutes.focus();
    }
  });

  document.addEventListener("input", function (e) {
    var el = e.target;
    // typing a question's own answer chooses "Other" (the radio beside the box)
    if (el.matches && el.matches(".other-answer [data-answer-text]")) {
      var other = el.closest(".other-answer").querySelector("input[type=radio][data-other]");
      if (other && el.value.trim()) other.checked = true;
    }
    if (el.matches && el.matches(".snooze input[name=minutes]") && el.form) {
      var choice = el.form.querySelector("select[name=for]");
      if (choice && el.value) choice.value = "minutes";
    }
  });

  document.addEventListener("click", function (e) {
    var t = e.target.closest ? e.target.closest("[data-dismiss-bulk], [data-keys-help]") : null;
    if (!t) return;
    if (t.hasAttribute("data-keys-help")) { help(); return; }
    var result = document.getElementById("bulk-result");
    if (result) result.textContent = "";
  });

  // htmx enables the bulk buttons again when the bulk request ends: disabled again while nothing is chosen.
  document.addEventListener("htmx:afterRequest", function (e) {
    if (e.target && e.target.id === "bulk-form") syncSelection();
  });

  // One confirmation per bulk decision, its result (#bulk-result): the live toasts about the
  // requests it decided ("You approved ...", one per request) are not shown in this tab.
  // Noted when it is sent, since a live update may arrive before its answer.
  var bulkDecided = {};  // "request-<pk>" (a toast's data-request) -> true
  document.addEventListener("htmx:beforeRequest", function (e) {
    if (!e.target || e.target.id !== "bulk-form") return;
    var all = document.getElementById("bulk-all");
    rows().forEach(function (row) {
      var pk = /^row-(\d+)$/.exec(row.id || "");
      if (pk && (selected[row.dataset.requestId] || (all && all.checked))) bulkDecided["request-" + pk[1]] = true;
    });
  });
  document.addEventListener("htmx:oobBeforeSwap", function (e) {
    var d = e.detail;
    if (!d || !d.target || d.target.id !== "toasts" || !d.fragment || !d.fragment.querySelector) return;
    var toast = d.fragment.querySelector(".toast[data-request]");
    if (toast && bulkDecided[toast.dataset.request]) d.shouldSwap = false;
    // the whole decision's toast (another tab of the decider says it): this tab's result says it
    var whole = d.fragment.querySelector(".toast[data-bulk]");
    if (whole && whole.dataset.bulk.split(" ").some(function (id) { return bulkDecided[id]; })) d.shouldSwap = false;
  });

  // The list again after a bulk decision (the decided rows leave it); the result stays
  // (#bulk-result is hx-preserve).
  document.addEventListener("toolnexus:bulk-done", function (e) {
    var done = (e.detail && e.detail.done) || [];
    done.forEach(function (id) {
      delete selected[id];
      var row = rowById(id);
      if (row && !listShowsDecided()) row.classList.add("kb-gone");
    });
    var all = document.getElementById("bulk-all");
    if (all) all.checked = false;
    // the reason went with the decision: the box is empty for the next one (it is
    // hx-preserve, so no redraw of the list would empty it)
    var reason = document.getElementById("bulk-reason");
    if (reason && done.length) reason.value = "";
    allFor = grewFor = null;
    syncSelection();
    reloadList();
  });

  function listShowsDecided() {
    var state = new URLSearchParams(location.search).get("state") || "pending";
    return state !== "pending";
  }

  // Snoozed or ignored: it leaves this reviewer's list (un-hidden: leaves the list of hidden
  // ones), the next request opens.
  function leaves(hiddenOnly) {
    return function (e) {
      var id = e.detail && e.detail.id;
      var listsHidden = new URLSearchParams(location.search).get("hidden") === "only";
      if (id && listsHidden === hiddenOnly) leave(id);
    };
  }
  document.addEventListener("toolnexus:hidden", leaves(false));
  document.addEventListener("toolnexus:unhidden", leaves(true));

  function leave(id) {
    var row = rowById(id);
    var list = rows();
    decidingIndex = row ? list.indexOf(row) : -1;
    if (row) row.classList.add("kb-gone");
    delete selected[id];
    syncSelection();
    advance(id);
    if (row) row.remove();
  }

  // -- taking over a claim, and a decision's aftermath ------------------------------------------

  function claimHolder(requestId) {
    var bar = $('.claim-bar[data-request-id="' + CSS.escape(requestId) + '"]');
    var holder = bar ? bar.dataset.claimedBy : "";
    var me = (bar && bar.dataset.viewer) || findViewer();
    return holder && holder !== me ? holder : "";
  }

  function hidden(form, name, value) {
    var input = form.querySelector('input[type=hidden][name="' + name + '"]');
    if (!input) {
      input = document.createElement("input");
      input.type = "hidden";
      input.name = name;
      form.appendChild(input);
    }
    input.value = value;
  }

  document.addEventListener("htmx:confirm", function (e) {
    var d = e.detail, form = d && d.elt;
    if (!form || !form.closest || (d.verb || "").toLowerCase() !== "post") return;
    var card = form.closest("article.card");
    if (!card || !card.dataset.requestId || form.querySelector("input[name=takeover]")) return;
    var holder = claimHolder(card.dataset.requestId);
    if (!holder) return;
    e.preventDefault();
    var question = holder + " claimed this request. Take it over and decide it?";
    if (d.question) question += "\n\n" + d.question;
    if (!window.confirm(question)) return;
    hidden(form, "takeover", "1");
    d.issueRequest(true);
  });

  function decisionCard(d) {
    var t = d && d.target;
    return t && t.matches && t.matches("#detail article.card") ? t : null;
  }

  document.addEventListener("htmx:beforeRequest", function (e) {
    var d = e.detail, card = decisionCard(d);
    // Whoever opens a request (a click, this file, app.js after a decision), keys wait for it.
    if (d && d.target && d.target.id === "detail") {
      detailLoading = true;
      // a load that is not the row the keys asked for (a click elsewhere, the next request
      // after a decision) replaces theirs: the request it opens is the one to follow
      var from = d.elt && d.elt.closest ? d.elt.closest("#request-rows li.row") : null;
      if (!from || from.dataset.requestId !== opening) opening = null;
      else openingXhr = d.xhr;
      var mine = ++loads;
      setTimeout(function () { if (mine === loads && detailLoading) { detailLoading = false; opening = null; runQueued(); } }, 8000);
    }
    if (!card || !d.requestConfig || d.requestConfig.verb !== "post") return;
    var row = rowById(card.dataset.requestId);
    decidingIndex = row ? rows().indexOf(row) : -1;
  });

  document.addEventListener("htmx:afterRequest", function (e) {
    var d = e.detail;
    if (!d || !d.xhr || !d.target || !d.target.matches) return;
    if (!d.successful) {
      // a load another replaced (aborted) leaves the keys waiting for that other one
      if (d.target.id === "detail" && (!opening || d.xhr === openingXhr)) { detailLoading = false; opening = null; }
      return;
    }
    var t = d.target, detail = document.getElementById("detail");
    if (t.id === "detail") return;  // loaded: ready once settled (htmx:afterSettle)
    if (!detail || !t.matches("article.card") || !d.requestConfig || d.requestConfig.verb !== "post") return;
    var id = t.dataset.requestId, now = t.id ? document.getElementById(t.id) : null;
    if (!id || !(detail.contains(t) || (now && detail.contains(now)))) return;
    var outcome = d.xhr.getResponseHeader("X-Toolnexus-Outcome");
    if (outcome !== "success" && outcome !== "warning") return;  // an error keeps the card
    var api = window.toolnexusInbox;
    if (api && api.advancesAfterDecision) return;  // the page's own layer opens the next one
    var state = d.xhr.getResponseHeader("X-Toolnexus-State");
    if (state && state !== "pending" && !listShowsDecided()) {
      var row = rowById(id);
      if (row) row.classList.add("kb-gone");
    }
    advance(id);
  });

  // -- keeping up with swaps and live updates -----------------------------------------------------

  // A refresh of the claim bar (after a live message) never overwrites the answer of a claim
  // or release sent after it: that answer is newer than what the refresh read.
  var barPosts = 0, barPostsAtRefresh = {};
  function refreshClaimBar(id) {
    var bar = $('.claim-bar[data-request-id="' + CSS.escape(id) + '"]');
    if (!bar || !bar.dataset.url || !window.htmx || bar.contains(document.activeElement)) return;
    barPostsAtRefresh[bar.dataset.url] = barPosts;
    htmx.ajax("GET", bar.dataset.url, { target: bar, swap: "outerHTML" });
  }
  document.addEventListener("htmx:beforeRequest", function (e) {
    var d = e.detail, elt = d && d.elt;
    if (elt && elt.closest && elt.closest(".claim-bar") && d.requestConfig && d.requestConfig.verb === "post") barPosts++;
  });
  document.addEventListener("htmx:beforeSwap", function (e) {
    var d = e.detail, path = d && d.pathInfo && d.pathInfo.requestPath;
    if (!path || !d.requestConfig || d.requestConfig.verb !== "get" || !(path in barPostsAtRefresh)) return;
    if (barPostsAtRefresh[path] !== barPosts) d.shouldSwap = false;
    delete barPostsAtRefresh[path];
  });

  // What a reviewer chose or typed in a claim bar and has not sent (the snooze menu, its
  // minutes) goes into the bar that replaces it: a refresh after a live update, the answer
  // of the bar's own forms (claim, release, an error), a decision's out-of-band bar. Taken
  // as that swap is about to happen, put back into the bar it brought (the event's own
  // element), by the form's action and the field's name; a field the new bar lacks is gone.
  var unsentIn = {};
  function fieldKey(el) { return (el.form ? el.form.getAttribute("action") : "") + "|" + el.name; }
  function defaultOption(select) {  // the one a fresh menu shows: marked selected, or the first
    return Array.prototype.filter.call(select.options, function (o) { return o.defaultSelected; })[0] || select.options[0];
  }
  function unsentChoices(bar) {
    var choices = {};
    $$("select[name], input[name]:not([type=hidden]), textarea[name]", bar).forEach(function (el) {
      var changed = el.tagName === "SELECT"
        ? el.options.length > 0 && el.selectedIndex !== defaultOption(el).index
        : el.type === "checkbox" || el.type === "radio" ? el.checked !== el.defaultChecked
          : el.value !== el.defaultValue;
      if (changed) choices[fieldKey(el)] = el.type === "checkbox" || el.type === "radio" ? el.checked : el.value;
    });
    return choices;
  }
  function takeUnsent(bar, swapping) {
    if (!swapping || !bar || !bar.matches || !bar.matches(".claim-bar") || !bar.isConnected) return;
    var choices = unsentChoices(bar);
    if (Object.keys(choices).length) unsentIn[bar.dataset.requestId] = choices;
  }
  // Listeners of the same events added earlier (app.js, the bar's refresh guard above) have
  // decided whether the swap happens: these run after them.
  document.addEventListener("htmx:beforeSwap", function (e) {
    takeUnsent(e.detail && e.detail.target, e.detail && e.detail.shouldSwap);
  });
  document.addEventListener("htmx:oobBeforeSwap", function (e) {
    takeUnsent(e.detail && e.detail.target, e.detail && e.detail.shouldSwap !== false);
  });
  function restoreUnsent(e) {
    var bar = e.target;  // the element the swap brought in
    if (!bar || !bar.matches || !bar.matches(".claim-bar")) return;
    var id = bar.dataset.requestId, choices = unsentIn[id];
    delete unsentIn[id];
    if (!choices) return;
    $$("select[name], input[name]:not([type=hidden]), textarea[name]", bar).forEach(function (el) {
      var key = fieldKey(el);
      if (!(key in choices)) return;
      if (el.type === "checkbox" || el.type === "radio") el.checked = choices[key];
      else el.value = choices[key];
    });
  }
  document.addEventListener("htmx:afterSwap", restoreUnsent);
  document.addEventListener("htmx:oobAfterSwap", restoreUnsent);

  // The filter menus' counts come with each list update, an option's text each (out of
  // band): one whose text did not change is not written again, so a menu open under the
  // pointer is redrawn only when a count in it changed.
  document.addEventListener("htmx:oobBeforeSwap", function (e) {
    var d = e.detail, t = d && d.target;
    if (t && t.tagName === "OPTION" && d.fragment && d.fragment.textContent === t.textContent) {
      d.shouldSwap = false;
    }
  });

  var liveAbout = {};
  document.addEventListener("htmx:wsBeforeMessage", function (e) {
    inLive = true;
    var message = e.detail && e.detail.message;
    var bar = $("#detail .claim-bar");
    if (bar && typeof message === "string" && message.indexOf('data-request-id="' + bar.dataset.requestId + '"') >= 0) {
      liveAbout[bar.dataset.requestId] = true;
    }
  });

  document.addEventListener("htmx:wsAfterMessage", function () {
    inLive = false;
    arrivals();
    Object.keys(liveAbout).forEach(refreshClaimBar);
    liveAbout = {};
    refresh();
  });

  function decorate() {
    var card = detailCard();
    if (!card || !card.querySelector(".actions")) return;
    var hint = function (el, key) {
      if (!el || el.querySelector(".key-hint")) return;
      var k = document.createElement("kbd");
      k.className = "key-hint";
      k.setAttribute("aria-hidden", "true");
      k.textContent = key;
      el.appendChild(k);
    };
    var form = approveForm(card), calls = callsForm(card);
    hint(form && form.querySelector("button[type=submit]"), "a");
    var decline = $("form.decline button[type=submit]", card);
    hint(decline, "d");
    hint($("details.edit > summary", card), "e");
    var answer = answerField(card);
    if (answer && answer.form) hint(answer.form.querySelector("button[type=submit]"), form ? "r" : "a / r");
    if (!form && calls) hint(calls.querySelector("button[type=submit]"), "a");  // approves every call
  }

  function refresh() {
    if (cursorId && !rowById(cursorId)) cursorId = openId();
    // no cursor yet, or the filters changed: a frame only on the open request's row
    var row = cursorId ? cursorRow() : openId() && rowById(openId());
    setCursor(row || null, false);
    syncSelection();
    decorate();
    updateTitle();
  }

  // Other filters, a search or a sort drawn the list anew: the cursor frame leaves it (a
  // live redraw of the same list keeps it, as does the row of the open request).
  document.addEventListener("htmx:beforeRequest", function (e) {
    var d = e.detail;
    if (inLive || !d || !d.target || d.target.id !== "request-list" || !d.elt) return;
    if (d.elt.closest && d.elt.closest("#inbox-filters, #inbox-chips")) cursorId = null;
  });

  // A list drawn again (htmx's answer, a live snapshot): its bulk bar comes unchecked; the
  // selection is put back as the swap happens, not at the settle after it, so the bar never
  // posts a choice the reviewer made without it in between.
  function listSwapped(e) {
    var t = e.target;
    if (t && t.querySelector && (t.id === "bulk-form" || t.querySelector("#bulk-form"))) syncSelection();
  }
  document.addEventListener("htmx:afterSwap", listSwapped);
  document.addEventListener("htmx:oobAfterSwap", listSwapped);

  // A request opened (whoever opened it): the keys may act on it, the cursor follows it.
  // Unless j/k went on to another row meanwhile (a request that came in just before the
  // one they asked for): the cursor stays, and the keys wait for that one.
  function stillOpening(card) {
    if (opening && card && card.dataset.requestId !== opening && rowById(opening)) return true;
    opening = null;
    return false;
  }
  document.addEventListener("htmx:afterSwap", function (e) {
    var t = e.detail && e.detail.target;
    if (!t || t.id !== "detail") return;
    var card = detailCard(), row = card && rowById(card.dataset.requestId);
    if (stillOpening(card)) return;
    detailLoading = false;
    if (row) setCursor(row, false);
  });

  document.addEventListener("htmx:afterSettle", function (e) {
    if (!inLive) $$("#request-rows li.row").forEach(function (r) { seen[r.dataset.requestId] = true; });
    var t = e.detail && e.detail.target;
    if (t && t.id === "detail" && !stillOpening(detailCard())) {  // a request opened
      detailLoading = false;
      var card = detailCard();
      if (card && cursorId !== card.dataset.requestId && rowById(card.dataset.requestId)) setCursor(rowById(card.dataset.requestId), false);
    }
    refresh();
    runQueued();
  });

  // -- the list redraws itself ------------------------------------------------------------------
  // When a request enters it: a live row for a request the list did not show (a claim
  // released under "unclaimed", a request un-hidden elsewhere) has no place to go, and the
  // list is drawn again with it. When it changes by itself: the server says in how many
  // seconds a snooze of this reviewer ends or a claim lapses (data-lapse-in, relative: the
  // browser's clock does not matter), and the list is drawn again then, with the open
  // request's claim bar. Selections, "all matching" and typed text stay (syncSelection,
  // hx-preserve); the counts come with the list.
  document.addEventListener("htmx:oobErrorNoTarget", function (e) {
    var content = e.detail && e.detail.content;
    if (content && /^row-\d+$/.test(content.id || "")) reloadList();
  });

  var LAPSE_MARGIN = 500;  // ms after the lapse: the server has surely passed it
  var lapseTimer = null, lapseDue = Infinity;
  function scheduleLapses() {
    var now = Date.now();
    $$("[data-lapse-in]").forEach(function (el) {
      if (el.dataset.lapseSeen === el.dataset.lapseIn) return;
      el.dataset.lapseSeen = el.dataset.lapseIn;
      var seconds = parseFloat(el.dataset.lapseIn);
      if (!isFinite(seconds) || seconds < 0) return;
      var due = now + seconds * 1000 + LAPSE_MARGIN;
      if (due >= lapseDue) return;
      lapseDue = due;
      clearTimeout(lapseTimer);
      lapseTimer = setTimeout(lapsed, due - now);
    });
  }
  function lapsed() {
    lapseTimer = null;
    lapseDue = Infinity;
    reloadList();
    var bar = $("#detail .claim-bar");
    if (bar) refreshClaimBar(bar.dataset.requestId);
  }
  document.addEventListener("htmx:afterSettle", scheduleLapses);
  document.addEventListener("htmx:oobAfterSwap", scheduleLapses);

  // -- title, notifications, sound -----------------------------------------------------------------

  function updateTitle() {
    var count = document.getElementById("request-count");
    if (!count) return;
    var raw = count.dataset.pending !== undefined ? count.dataset.pending : count.dataset.count;
    if (raw === undefined) return;
    var n = parseInt(raw, 10);  // "1000+" past the count's cap
    var base = document.title.replace(/^\(\d+\+?\)\s*/, "");
    var title = (n > 0 ? "(" + n + (/\+$/.test(raw) ? "+" : "") + ") " : "") + base;
    if (document.title !== title) document.title = title;
  }

  function stored(key) { try { return localStorage.getItem(key) === "1"; } catch (err) { return false; } }
  function store(key, on) { try { localStorage.setItem(key, on ? "1" : "0"); } catch (err) { /* private mode */ } }

  function notifyOn() {
    return stored(NOTIFY_KEY) && "Notification" in window && Notification.permission === "granted";
  }

  var audio = null;
  function beep() {
    var Ctx = window.AudioContext || window.webkitAudioContext;
    var toggle = document.getElementById("sound-toggle");
    if (toggle) toggle.dataset.beeps = String(parseInt(toggle.dataset.beeps || "0", 10) + 1);
    if (!Ctx) return;
    try {
      audio = audio || new Ctx();
      var osc = audio.createOscillator(), gain = audio.createGain();
      osc.type = "sine";
      osc.frequency.value = 880;
      gain.gain.setValueAtTime(0.08, audio.currentTime);
      gain.gain.exponentialRampToValueAtTime(0.001, audio.currentTime + 0.2);
      osc.connect(gain);
      gain.connect(audio.destination);
      osc.start();
      osc.stop(audio.currentTime + 0.2);
    } catch (err) { /* no audio here */ }
  }

  function arrivals() {
    var fresh = rows().filter(function (r) {
      return !seen[r.dataset.requestId] && !r.classList.contains("kb-gone") &&
        (r.classList.contains("state-pending") || !/\bstate-/.test(r.className));
    });
    rows().forEach(function (r) { seen[r.dataset.requestId] = true; });
    if (!fresh.length) return;
    if (stored(SOUND_KEY)) beep();
    if (!notifyOn() || document.visibilityState === "visible") return;
    fresh.slice(0, 3).forEach(function (row) {
      var id = row.dataset.requestId;
      var what = textOf($("a.row-link", row)) || "a request is waiting";
      try {
        var n = new Notification("New request: " + what.slice(0, 80), {
          body: what.slice(0, 200),
          tag: "toolnexus-" + id,
        });
        n.onclick = function () { openFromNotification(id); n.close(); };
      } catch (err) { /* notifications refused in this context */ }
    });
  }

  // A click on a notification: this tab, with that request open (`?r=<id>` in the URL), its
  // row listed or not (the list may have moved on: other filters, another page, a decision).
  function openFromNotification(id) {
    try { window.focus(); } catch (err) { /* not allowed here */ }
    if (id === openId() && detailCard()) return;
    var row = rowById(id);
    if (row) { openRow(row); return; }
    var api = window.toolnexusInbox;
    if (api && typeof api.select === "function" && api.select(id)) return;
    var params = new URLSearchParams(location.search);
    params.set("r", id);
    params.delete("page");
    location.assign(location.pathname + "?" + params.toString());
  }

  function setupToggles() {
    var tools = document.getElementById("triage-tools");
    if (tools) tools.hidden = false;
    var notify = document.getElementById("notify-toggle");
    if (notify && !notify.dataset.bound) {
      notify.dataset.bound = "1";
      notify.checked = notifyOn();
      notify.addEventListener("change", function () {
        if (!notify.checked) { store(NOTIFY_KEY, false); return; }
        if (!("Notification" in window)) { notify.checked = false; notify.title = "This browser has no notifications"; return; }
        Notification.requestPermission().then(function (permission) {
          var ok = permission === "granted";
          notify.checked = ok;
          store(NOTIFY_KEY, ok);
          notify.title = ok ? "" : "The browser blocks notifications for this site";
        });
      });
    }
    var sound = document.getElementById("sound-toggle");
    if (sound && !sound.dataset.bound) {
      sound.dataset.bound = "1";
      sound.checked = stored(SOUND_KEY);
      sound.addEventListener("change", function () {
        store(SOUND_KEY, sound.checked);
        if (sound.checked) beep();  // a sample, and the audio is unlocked by this click
      });
    }
  }

  function init() {
    findViewer();
    rows().forEach(function (r) { seen[r.dataset.requestId] = true; });
    setupToggles();
    var open = openId();
    if (open && rowById(open)) setCursor(rowById(open), false);
    refresh();
    scheduleLapses();
    if (window.MutationObserver) {
      var scheduled = false;
      new MutationObserver(function () {
        if (scheduled) return;
        scheduled = true;
        setTimeout(function () { scheduled = false; updateTitle(); setupToggles(); }, 50);
      }).observe(document.body, { childList: true, subtree: true, attributes: true, attributeFilter: ["data-count", "data-pending"] });
    }
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
