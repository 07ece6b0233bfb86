// Small progressive enhancements; every page works without this file.
//
// The inbox (approvals/inbox.html) is a list of rows (#request-rows li.row) and a detail
// pane (#detail) showing the selected request (`r=` in the URL). This file exposes
//   window.toolnexusInbox (also window.approvalsInbox) = {
//     select(requestId)      open that request in the detail pane (URL pushed, like a click),
//     selectFirstOf(ids)     open the first of these request ids still listed; false if none,
//     selected()             the request id the detail pane shows ("" for none),
//     advancesAfterDecision: true   after a decision in the pane this file opens the next row
//   }
// and tells the live socket which request the pane shows ({"viewing": id} frames, repeated
// while it stays open) so other reviewers read "(reviewer2 is viewing)".
(function () {
  "use strict";

  function pad(n) { return n < 10 ? "0" + n : "" + n; }

  // Expiry countdowns: "expires in 4m 12s", then "expired".
  function tick() {
    var now = Date.now();
    document.querySelectorAll("[data-expires-at]").forEach(function (el) {
      var left = Math.round((Date.parse(el.dataset.expiresAt) - now) / 1000);
      if (isNaN(left)) return;
      if (left <= 0) { el.textContent = "expired"; el.classList.add("overdue"); return; }
      var h = Math.floor(left / 3600), m = Math.floor((left % 3600) / 60), s = left % 60;
      el.textContent = "expires in " + (h ? h + "h " + pad(m) + "m" : m ? m + "m " + pad(s) + "s" : s + "s");
      el.classList.toggle("soon", left < 300);
    });
  }
  setInterval(tick, 1000);
  document.addEventListener("DOMContentLoaded", tick);
  document.addEventListener("htmx:afterSettle", tick);

  // Toasts fade after a while (warnings and errors stay longer), and at most a few show at
  // once so a burst of live updates cannot bury the page; the live region remains.
  var MAX_TOASTS = 4;
  function fadeToasts() {
    var toasts = document.querySelectorAll("#toasts .toast");
    for (var i = 0; i < toasts.length - MAX_TOASTS; i++) toasts[i].remove();
    document.querySelectorAll("#toasts .toast:not([data-timer])").forEach(function (t) {
      t.dataset.timer = "1";
      var urgent = t.classList.contains("warning") || t.classList.contains("error");
      setTimeout(function () { t.remove(); }, urgent ? 30000 : 15000);
    });
  }
  document.addEventListener("htmx:oobAfterSwap", fadeToasts);
  document.addEventListener("DOMContentLoaded", fadeToasts);

  // == Live record ==========================================================================
  // What a reviewer sees must be what happened, and what they typed must survive:
  // - a decision's own htmx answer is the authority in the deciding tab: while it is in
  //   flight, live pushes about that card are held off; after it, the card leaves a list
  //   that no longer shows it, a toast confirms "You declined: ..." once, focus moves on;
  // - a live push or the socket's snapshot never replaces a card the reviewer is using
  //   (focused, typed into, deciding, editor open): the card keeps its form and says the
  //   request changed (and who decided it), with a button to reload it;
  // - failed requests (offline, 5xx, 403, signed out) say so next to the card and keep the
  //   typed text; a signed-out page says so at the top and stops being live.

  var deciding = {};     // card id -> {after: the rows to open next} while its decision is in flight
  var decidedHere = {};  // card id -> true once this tab got the answer to its decision
  var news = {};         // card id -> the latest live toast text about it ("Already declined by ...")
  var inLiveMessage = false;
  var afterLive = [];    // work to do once the current live message is swapped in
  var handledXhrs = typeof WeakSet === "function" ? new WeakSet() : null;

  function isCard(el) { return !!(el && el.nodeType === 1 && el.matches("article.card")); }
  function cardOf(el) { return el && el.closest ? el.closest("article.card") : null; }
  function cardById(id) { var el = document.getElementById(id); return isCard(el) ? el : null; }
  function textOf(el) { return el ? el.textContent.replace(/\s+/g, " ").trim() : ""; }

  function isField(el) {
    return !!(el && el.matches && el.matches("input, textarea, select") &&
      !(el.type === "hidden" || el.type === "submit" || el.type === "button"));
  }

  // A card the reviewer is working in: never replaced or removed under their hands.
  function inUse(card) {
    if (deciding[card.id] || card.dataset.dirty || card.classList.contains("preview")) return true;
    // A late decision's card says who decided first; that decision's live push, arriving
    // after the answer, says the same without it: the card stays as it is.
    if (card.dataset.late) return true;
    var open = card.querySelectorAll("details[open]");  // the argument editor, opened
    for (var i = 0; i < open.length; i++) if (open[i].querySelector("input, textarea, select")) return true;
    var active = document.activeElement;
    return !!(active && active !== card && card.contains(active));
  }

  function markDirty(e) {
    var card = cardOf(e.target);
    if (card && isField(e.target)) card.dataset.dirty = "1";
  }
  document.addEventListener("input", markDirty, true);
  document.addEventListener("change", markDirty, true);

  // -- notices in a card, alerts at the top of the page -------------------------------------

  function cardNotice(card, cls, text, reload) {
    var old = card.querySelector("." + cls);
    if (old) old.remove();
    var p = document.createElement("div");
    p.className = "notice " + cls + (cls === "client-notice" ? " error" : " warning");
    p.setAttribute("role", cls === "client-notice" ? "alert" : "status");
    var span = document.createElement("span");
    span.textContent = text;
    p.appendChild(span);
    if (reload) {
      var button = document.createElement("button");
      button.type = "button";
      button.className = "link";
      button.textContent = "Reload it";
      button.addEventListener("click", function () { reloadCard(card); });
      p.appendChild(document.createTextNode(" "));
      p.appendChild(button);
    }
    var head = card.querySelector(".card-head");
    var actions = card.querySelector(".actions");
    if (cls === "client-notice" && actions) actions.parentNode.insertBefore(p, actions);
    else if (head) head.parentNode.insertBefore(p, head.nextSibling);
    else card.insertBefore(p, card.firstChild);
    return p;
  }

  function pageAlert(key, build) {
    var region = document.getElementById("page-alerts");
    if (!region) return null;
    var old = region.querySelector('[data-alert="' + key + '"]');
    if (old) return old;
    var p = document.createElement("p");
    p.className = "notice error";
    p.setAttribute("role", "alert");
    p.dataset.alert = key;
    build(p);
    region.appendChild(p);
    return p;
  }

  function tell(elt, text) {
    var card = cardOf(elt);
    if (card && card.isConnected) {
      cardNotice(card, "client-notice", text, false);
    } else {
      var alert = pageAlert("request-failed", function () {});
      if (alert) alert.textContent = text;
    }
  }

  // The app's frame (approvals/base.html) says where the app and the sign-in page are: the
  // app may be mounted at any prefix of a project.
  function appData(name, fallback) {
    var frame = document.querySelector(".approvals-app");
    return (frame && frame.dataset[name]) || fallback;
  }

  function appUrl(path) { return appData("appRoot", "/") + path; }

  function loginUrl() {
    var base = appData("loginUrl", "/accounts/login/");
    return base + "?next=" + encodeURIComponent(location.pathname + location.search);
  }

  function signedOut() {
    var live = document.getElementById("live");
    if (live) { delete live.dataset.wsOpen; live.textContent = "signed out"; }
    pageAlert("signed-out", function (p) {
      p.appendChild(document.createTextNode("You are signed out — "));
      var a = document.createElement("a");
      a.href = loginUrl();
      a.target = "_blank";  // a new tab: what is typed here stays, then try again
      a.rel = "noopener";
      a.textContent = "sign in again";
      p.appendChild(a);
      p.appendChild(document.createTextNode(
        " (in a new tab, so what you typed here stays; then try again). This page is no longer live."));
    });
  }

  // -- reloading a card the reviewer chose to refresh ---------------------------------------

  function reloadCard(card) {
    delete card.dataset.dirty;
    var url = appUrl("requests/" + encodeURIComponent(card.dataset.requestId || "") + "/card/");
    if (window.htmx) htmx.ajax("GET", url, { target: card, swap: "outerHTML" });
    else location.reload();
  }

  // Who decided a request the page only knows is gone: ask for its card.
  function describeLater(cardId, prefix) {
    var card = cardById(cardId);
    if (!card || !window.fetch) return;
    fetch(appUrl("requests/" + encodeURIComponent(card.dataset.requestId || "") + "/card/"),
          { headers: { "HX-Request": "true" }, credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : ""; })
      .then(function (html) {
        var t = document.createElement("template");
        t.innerHTML = html;
        var decided = textOf(t.content.querySelector(".decided"));
        var now = cardById(cardId);
        if (decided && now) markChanged(now, prefix + decided + ".");
      })
      .catch(function () {});
  }

  function markChanged(card, what, stillPending) {
    // A late decision's card (data-late) already says who decided: the news is said once.
    if (!stillPending && card.dataset.late) return;
    cardNotice(card, "live-notice", what + (stillPending
      ? " What you typed stays here until you reload it."
      : " What you typed here was not sent."), true);
  }

  // -- live messages ------------------------------------------------------------------------

  document.addEventListener("htmx:wsBeforeMessage", function (e) {
    inLiveMessage = true;
    setTimeout(function () { inLiveMessage = false; }, 0);
    var message = e.detail && e.detail.message;
    if (typeof message !== "string" || message.indexOf("data-request") < 0) return;
    var t = document.createElement("template");
    t.innerHTML = message;
    t.content.querySelectorAll(".toast[data-request]").forEach(function (p) {
      news[p.dataset.request] = textOf(p);
    });
  });

  document.addEventListener("htmx:wsAfterMessage", function () {
    inLiveMessage = false;
    var work = afterLive.splice(0);
    work.forEach(function (fn) { fn(); });
    fadeToasts();
    relativeTimes();
  });

  function decidedText(incoming) {
    var decided = incoming && incoming.querySelector(".decided");
    return decided ? textOf(decided) : "";
  }

  function keepFocus(card) {
    // A focused card (not a field in it) that a push replaces or removes: focus follows.
    if (document.activeElement !== card) return;
    var next = nextCard(card);
    afterLive.push(function () {
      var same = cardById(card.id);
      focusCard(same || next || listFallback());
    });
  }

  document.addEventListener("htmx:oobBeforeSwap", function (e) {
    if (!inLiveMessage) return;  // an htmx answer's own out-of-band parts: always welcome
    var d = e.detail, target = d.target, fragment = d.fragment;
    if (!target) return;

    if (target.id === "toasts") {
      // News about a card this tab is deciding or decided: its own answer says it; about a
      // card the reviewer is working in: the card says it (markChanged), once.
      var toast = fragment && fragment.querySelector && fragment.querySelector(".toast[data-request]");
      var about = toast && cardById(toast.dataset.request);
      if (toast && (deciding[toast.dataset.request] || decidedHere[toast.dataset.request] || (about && inUse(about)))) {
        d.shouldSwap = false;
      }
      return;
    }

    if (isCard(target)) {
      if (!inUse(target)) { keepFocus(target); return; }
      d.shouldSwap = false;
      if (deciding[target.id]) return;  // this tab's answer is on its way and settles it
      var incoming = fragment && fragment.querySelector && fragment.querySelector("article.card");
      var id = target.id;
      afterLive.push(function () {
        var card = cardById(id);
        if (!card) return;
        // A decision is final: a card that shows one is never older than a pending push.
        if (card.dataset.late && incoming && incoming.classList.contains("state-pending")) return;
        if (incoming && incoming.classList.contains("state-pending")) {
          markChanged(card, "This request changed while you were working on it: reload it to see the new version.", true);
        } else if (news[id]) {
          markChanged(card, "This request is no longer pending. " + news[id] + ".");
        } else if (incoming && decidedText(incoming)) {
          markChanged(card, "This request is no longer pending: " + decidedText(incoming) + ".");
        } else {
          markChanged(card, "This request is no longer pending.");
          describeLater(id, "This request is no longer pending: ");
        }
      });
      return;
    }

    // A container, e.g. the whole list in the socket's snapshot: cards in use stay as they are.
    if (!target.querySelectorAll || !fragment || !fragment.querySelector) return;
    target.querySelectorAll("article.card").forEach(function (card) {
      if (!inUse(card)) { keepFocus(card); return; }
      var incoming = fragment.querySelector("#" + CSS.escape(card.id));
      var state = incoming ? (incoming.classList.contains("state-pending") ? "pending" : "decided") : "gone";
      var said = decidedText(incoming);
      if (!incoming) {
        // Not in the new content: keep it where it was (the inbox list), or near the top of
        // the new content (the run page, whose body no longer has an open request).
        incoming = document.createElement("article");
        incoming.id = card.id;
        var cards = fragment.querySelector("#request-cards");
        if (cards) {
          var before = card.previousElementSibling;
          var anchor = before && before.id ? cards.querySelector("#" + CSS.escape(before.id)) : null;
          cards.insertBefore(incoming, anchor ? anchor.nextSibling : cards.firstChild);
          var empty = fragment.querySelector("#inbox-empty");
          if (empty) empty.remove();
        } else {
          var root = fragment.firstElementChild;
          if (!root) return;
          root.insertBefore(incoming, root.firstElementChild ? root.firstElementChild.nextSibling : null);
        }
      }
      incoming.setAttribute("hx-preserve", "true");  // htmx keeps the element on the page as it is
      var active = document.activeElement;
      var selection = null;
      try {
        if (active && card.contains(active) && typeof active.selectionStart === "number") {
          selection = [active.selectionStart, active.selectionEnd];
        }
      } catch (err) { /* a field without a text selection */ }
      var id = card.id;
      afterLive.push(function () {
        var kept = cardById(id);
        if (!kept) return;
        kept.removeAttribute("hx-preserve");
        if (active && kept.contains(active) && document.activeElement !== active) {
          active.focus({ preventScroll: true });
          if (selection) { try { active.setSelectionRange(selection[0], selection[1]); } catch (err) { /* not a text field */ } }
        }
        if (deciding[id] || state === "pending") return;
        if (news[id]) {
          markChanged(kept, "This request is no longer pending. " + news[id] + ".");
        } else if (state === "decided" && said) {
          markChanged(kept, "This request is no longer pending: " + said + ".");
        } else {
          markChanged(kept, "This request is no longer pending.");
          describeLater(id, "This request is no longer pending: ");
        }
      });
    });
  });

  // -- this tab's own decisions ---------------------------------------------------------------

  function nextCard(card) {
    var el = card.nextElementSibling;
    while (el && !isCard(el)) el = el.nextElementSibling;
    if (el) return el;
    el = card.previousElementSibling;
    while (el && !isCard(el)) el = el.previousElementSibling;
    return el;
  }

  function listFallback() {
    return document.getElementById("inbox-empty") || document.getElementById("request-list");
  }

  function focusCard(el) {
    if (!el) return;
    if (!el.hasAttribute("tabindex")) el.setAttribute("tabindex", "-1");
    el.focus({ preventScroll: true });
  }

  // Whether this inbox page lists requests in `state` (its filter: "pending" by default).
  function listShows(state) {
    var shown = new URLSearchParams(location.search).get("state") || "pending";
    return shown === "all" || shown === state;
  }

  function fieldKey(el) {
    var form = el.form;
    return (form ? form.getAttribute("action") : "") + "|" + el.name + "|" + (el.type === "radio" || el.type === "checkbox" ? el.value : "");
  }

  function typedValues(card) {
    var values = {};
    card.querySelectorAll("input, textarea, select").forEach(function (el) {
      if (!isField(el) || !el.name) return;
      values[fieldKey(el)] = el.type === "radio" || el.type === "checkbox" ? el.checked : el.value;
    });
    return values;
  }

  function restoreValues(card, values) {
    card.querySelectorAll("input, textarea, select").forEach(function (el) {
      if (!isField(el) || !el.name) return;
      var key = fieldKey(el);
      if (!(key in values)) return;
      if (el.type === "radio" || el.type === "checkbox") el.checked = values[key];
      else el.value = values[key];
    });
  }

  document.addEventListener("htmx:beforeRequest", function (e) {
    var d = e.detail, card = d && d.target;
    if (!isCard(card) || !d.requestConfig || d.requestConfig.verb !== "post") return;
    // Where the next request is chosen: now, as the decision is sent, from the list as the
    // reviewer sees it. A live update may take the decided row out before the answer comes.
    deciding[card.id] = { after: rowsAround(card.dataset.requestId) };
    card.dataset.deciding = "1";
    var old = card.querySelector(".client-notice");
    if (old) old.remove();
  });

  // The fresh card of an "error" answer (the request is still pending) gets what was typed.
  var carried = {};
  document.addEventListener("htmx:beforeSwap", function (e) {
    var d = e.detail;
    if (!d || !d.xhr || !isCard(d.target)) return;
    if (d.xhr.getResponseHeader("X-Toolnexus-Outcome") === "error") carried[d.target.id] = typedValues(d.target);
  });

  // Somebody decided first, and the card stays in sight: its notice says who (cards.late);
  // the answer's toast saying it too goes (it is for an inbox that moved on to the next).
  function dropToastAbout(id) {
    document.querySelectorAll("#toasts .toast[data-request]").forEach(function (t) {
      if (t.dataset.request === id) t.remove();
    });
  }

  document.addEventListener("htmx:afterRequest", function (e) {
    var d = e.detail;
    if (!d || !d.xhr || !isCard(d.target)) return;
    if (handledXhrs) { if (handledXhrs.has(d.xhr)) return; handledXhrs.add(d.xhr); }
    var old = d.target, id = old.id;
    var wasDeciding = deciding[id] || null;
    delete deciding[id];
    if (old.isConnected) delete old.dataset.deciding;
    if (!d.successful) return;  // nothing was swapped: the failure handlers said why
    var fresh = cardById(id);
    if (!fresh || fresh === old) return;
    var outcome = wasDeciding ? d.xhr.getResponseHeader("X-Toolnexus-Outcome") : null;
    if (outcome === "success" || outcome === "warning") {
      decidedHere[id] = true;
      if (fresh.closest("#detail")) {
        // The row leaves a list that no longer shows it (the state from the answer's
        // header: until htmx settles, the fresh card still wears the old one's attributes),
        // and the next row opens; with none left the decided card stays, saying the outcome.
        var requestId = fresh.dataset.requestId;
        var row = rowOf(requestId);
        if (row && !listShows(d.xhr.getResponseHeader("X-Toolnexus-State"))) row.remove();
        if (inbox.selectFirstOf(wasDeciding.after || [])) return;
        if (outcome === "warning") dropToastAbout(id);
        focusCard(fresh);
        return;
      }
      if (outcome === "warning") dropToastAbout(id);
    } else if (outcome === "error" && carried[id]) {
      restoreValues(fresh, carried[id]);
      fresh.dataset.dirty = "1";
    }
    delete carried[id];
    focusCard(fresh);  // keep keyboard focus on the card that changed
  });

  // -- the inbox: list and detail ----------------------------------------------------------------

  var socket = null;        // the live socket's wrapper (htmx ws extension), once open
  var viewingSent = null;   // the request id last told to the socket
  var PRESENCE_EVERY = 25000;

  function rows() { return Array.prototype.slice.call(document.querySelectorAll("#request-rows li.row")); }
  function rowOf(id) {
    return rows().filter(function (r) { return r.dataset.requestId === id; })[0] || null;
  }
  function detailPane() { return document.getElementById("detail"); }
  function selectedId() {
    var pane = detailPane();
    return (pane && pane.dataset.selected) || "";
  }

  function tellViewing(force) {
    var id = selectedId();
    if (!socket || (!force && id === viewingSent)) return;
    viewingSent = id;
    try { socket.send(JSON.stringify({ viewing: id, filters: location.search })); } catch (err) { /* reconnecting */ }
  }
  setInterval(function () { if (selectedId()) tellViewing(true); }, PRESENCE_EVERY);

  // The page follows the detail pane: the selected row, the phone's two screens, the socket.
  function syncSelection() {
    var box = document.getElementById("inbox");
    if (!box) return;
    var id = selectedId();
    if (box.dataset.selected !== id) box.dataset.selected = id;
    box.classList.toggle("has-selection", !!id);
    rows().forEach(function (r) {
      if (r.dataset.requestId === id) r.setAttribute("aria-current", "true");
      else r.removeAttribute("aria-current");
    });
    tellViewing(false);
  }

  function withSelection(id) {
    var params = new URLSearchParams(location.search);
    if (id) params.set("r", id); else params.delete("r");
    params.delete("page");
    var query = params.toString();
    return location.pathname + (query ? "?" + query : "");
  }

  // The other rows of the list in the order the next request is looked for after `id` is
  // decided: the ones below it, nearest first, then the ones above it, nearest first.
  function rowsAround(id) {
    var all = rows().filter(function (r) { return !r.classList.contains("kb-gone"); });
    var ids = all.map(function (r) { return r.dataset.requestId; });
    var at = ids.indexOf(id);
    if (at < 0) return ids;
    return ids.slice(at + 1).concat(ids.slice(0, at).reverse());
  }

  var inbox = {
    advancesAfterDecision: true,
    selected: selectedId,
    select: function (id) {
      if (!detailPane() || !window.htmx) return false;
      var row = rowOf(id), link = row && row.querySelector("a.row-link");
      if (link) { link.click(); return true; }
      var url = withSelection(id);
      htmx.ajax("GET", url, { target: "#detail", swap: "outerHTML" }).then(function () {
        history.pushState({ htmx: true }, "", url);
      });
      return true;
    },
    // Opens the first of these request ids still listed (decided ones leave the list); false
    // if none is.
    selectFirstOf: function (ids) {
      for (var i = 0; i < ids.length; i++) {
        var row = rowOf(ids[i]);
        if (row && !row.classList.contains("kb-gone")) { inbox.select(ids[i]); return true; }
      }
      return false;
    },
  };
  window.toolnexusInbox = window.approvalsInbox = inbox;

  document.addEventListener("htmx:wsOpen", function (e) {
    if (!e.target || e.target.id !== "live" || !e.detail) return;
    socket = e.detail.socketWrapper;
    tellViewing(true);
  });

  document.addEventListener("htmx:afterSettle", function (e) {
    var t = e.detail && e.detail.target;
    syncSelection();
    // The list of other filters, a search, a sort or another page: the socket follows it.
    if (t && t.id === "request-list" && !inLiveMessage && socket) {
      try { socket.send(JSON.stringify({ viewing: selectedId(), filters: location.search })); } catch (err) { /* reconnecting */ }
    }
    if (t && t.id === "detail" && !inLiveMessage) {
      // the pane as it is now (an outerHTML swap replaced the element the event names)
      var pane = detailPane();
      var card = pane && pane.querySelector("article.card");
      // Focus the request that opened, unless the reviewer already went on into one of its
      // fields (a key such as d may run as soon as the pane is in, before it settles).
      var active = document.activeElement;
      if (!(active && pane && pane.contains(active) && isField(active))) focusCard(card || pane);
      // Phones: the detail is a screen of its own (app.css), shown from its top.
      if (window.matchMedia && window.matchMedia("(max-width: 52rem)").matches) window.scrollTo(0, 0);
    }
  });
  function tellFilters(e) {
    if (!socket || !document.getElementById("inbox") || !e.detail || !e.detail.path) return;
    var search = new URL(e.detail.path, location.href).search;
    try { socket.send(JSON.stringify({ viewing: selectedId(), filters: search })); } catch (err) { /* reconnecting */ }
  }
  // This reviewer hid or showed a request: the socket counts their list for them from now on
  // (a count of every pending request would include what they hid).
  function tellHides() {
    if (!socket || !document.getElementById("inbox")) return;
    try { socket.send(JSON.stringify({ hides: true })); } catch (err) { /* reconnecting */ }
  }
  document.addEventListener("toolnexus:hidden", tellHides);
  document.addEventListener("toolnexus:unhidden", tellHides);
  document.addEventListener("htmx:pushedIntoHistory", tellFilters);
  document.addEventListener("htmx:replacedInHistory", tellFilters);
  document.addEventListener("htmx:historyRestore", syncSelection);
  window.addEventListener("popstate", function () { setTimeout(syncSelection, 0); });
  document.addEventListener("htmx:wsAfterMessage", function (e) {
    syncSelection();
    // A snapshot (on connect or reconnect): ask again for the shown request, in case it was
    // decided while this page was not live.
    var message = e.detail && e.detail.message;
    // Its list is for the URL the socket opened with: the filters may have changed since.
    if (socket && typeof message === "string" && message.indexOf('id="request-list"') >= 0) {
      var frame = { viewing: selectedId(), filters: location.search };
      if (frame.viewing) frame.resync = true;
      try { socket.send(JSON.stringify(frame)); } catch (err) { /* closed */ }
    }
  });
  document.addEventListener("DOMContentLoaded", syncSelection);

  // -- failures: offline, server errors, not allowed, signed out --------------------------------

  function loginPath() {
    try { return new URL(appData("loginUrl", "/accounts/login/"), location.href).pathname; }
    catch (err) { return "/accounts/login/"; }
  }

  function landedOnLogin(xhr) {
    try { return !!xhr.responseURL && new URL(xhr.responseURL).pathname === loginPath(); }
    catch (err) { return false; }
  }

  function deniedMessage(xhr) {
    var t = document.createElement("template");
    t.innerHTML = xhr.responseText || "";
    var said = textOf(t.content.querySelector("[data-denied]"));
    return said || "The server refused this (403 Forbidden): nothing was changed. " +
      "If you signed in again in another tab, reload this page.";
  }

  // Capture phase: before htmx handles the answer and before django-htmx's debug handler
  // (DEBUG only) replaces the whole page with an error page.
  document.addEventListener("htmx:beforeOnLoad", function (e) {
    var d = e.detail, xhr = d && d.xhr;
    if (!xhr) return;
    var status = xhr.status, out = status === 401 || (status < 400 && landedOnLogin(xhr));
    if (!out && status < 400) return;
    e.preventDefault();  // htmx swaps nothing: the form keeps what was typed
    e.stopPropagation();
    var elt = isCard(d.target) ? d.target : d.elt, verb = d.requestConfig && d.requestConfig.verb;
    var sending = verb && verb !== "get";
    if (out) {
      signedOut();
      tell(elt, "You are signed out: " + (sending ? "nothing was sent" : "nothing was loaded") +
        ". What you typed is kept; sign in again, then try again.");
    } else if (status === 403) {
      tell(elt, deniedMessage(xhr));
    } else if (status >= 500) {
      tell(elt, "The server failed (" + status + "): " +
        (sending ? "your decision was not confirmed" : "nothing was loaded") +
        "; what you typed is kept. Try again in a moment.");
    } else if (status === 404) {
      tell(elt, "This request no longer exists (404); what you typed is kept. Reload the page.");
    } else {
      tell(elt, "The server refused this (" + status + "): nothing was changed; what you typed is kept.");
    }
  }, true);

  function where(d) { return d ? (isCard(d.target) ? d.target : d.elt) : null; }
  document.addEventListener("htmx:sendError", function (e) {
    var verb = e.detail && e.detail.requestConfig && e.detail.requestConfig.verb;
    tell(where(e.detail), "Could not reach the server: " +
      (verb && verb !== "get" ? "your decision was not sent" : "nothing was loaded") +
      "; what you typed is kept. Try again when the connection is back.");
  });
  document.addEventListener("htmx:timeout", function (e) {
    tell(where(e.detail), "The server did not answer in time: your decision may not have been sent; what you typed is kept. Reload the card to check before trying again.");
  });

  // The page's live indicator (#live, the element holding the socket): "live" while open.
  document.addEventListener("htmx:ws-open", function (e) {
    var live = e.target;
    if (!live || live.id !== "live") return;
    live.dataset.wsOpen = "1";
    live.textContent = "live";
  });

  // A socket that closed reconnects by itself, unless the server closed it because the
  // session ended or access was withdrawn.
  document.addEventListener("htmx:ws-close", function (e) {
    var live = e.target;
    if (live && live.id === "live") {
      delete live.dataset.wsOpen;
      live.textContent = "reconnecting…";
    }
    var code = e.detail && e.detail.event && e.detail.event.code;
    if (code === 4401) signedOut();
    else if (code === 4403) {
      var live = document.getElementById("live");
      if (live) live.textContent = "not live";
      pageAlert("forbidden", function (p) {
        p.textContent = "Your account may no longer see these updates: this page is no longer live. Ask an administrator, or reload the page.";
      });
    } else if (code === 4404) {
      // What the page follows does not exist: the page already says so; nothing to follow.
      var live = document.getElementById("live");
      if (live) live.textContent = "not live";
    } else if (code === 4429) {
      var live = document.getElementById("live");
      if (live) live.textContent = "not live";
      pageAlert("too-many", function (p) {
        p.textContent = "Too many live pages are open for your account: this one is not live. Close some tabs, then reload this page.";
      });
    }
  });

  // Posts carry the CSRF token of the browser's current cookie, not the one the page (or a
  // pushed fragment) was rendered with: after signing in again in another tab the cookie
  // changed, and the page's own token would be refused.
  function cookie(name) {
    var found = document.cookie.split("; ").filter(function (c) { return c.indexOf(name + "=") === 0; })[0];
    return found ? decodeURIComponent(found.slice(name.length + 1)) : "";
  }
  document.addEventListener("htmx:configRequest", function (e) {
    var token = cookie("csrftoken");  // Django's CSRF_COOKIE_NAME (not HttpOnly here)
    if (!token || !e.detail || !e.detail.headers) return;
    e.detail.headers["X-CSRFToken"] = token;
    var params = e.detail.parameters;
    if (params && params.csrfmiddlewaretoken !== undefined) params.csrfmiddlewaretoken = token;
  });

  // -- relative times ("5 minutes ago") keep up -----------------------------------------------

  var UNITS = [["year", 31536000], ["month", 2592000], ["week", 604800], ["day", 86400], ["hour", 3600], ["minute", 60]];
  function since(seconds) {
    if (seconds < 60) return "just now";
    for (var i = 0; i < UNITS.length; i++) {
      var n = Math.floor(seconds / UNITS[i][1]);
      if (!n) continue;
      var text = n + " " + UNITS[i][0] + (n === 1 ? "" : "s");
      if (i + 1 < UNITS.length) {
        var rest = Math.floor((seconds - n * UNITS[i][1]) / UNITS[i + 1][1]);
        if (rest) text += ", " + rest + " " + UNITS[i + 1][0] + (rest === 1 ? "" : "s");
      }
      return text + " ago";
    }
    return "just now";
  }
  function relativeTimes() {
    var now = Date.now();
    document.querySelectorAll("time[datetime]").forEach(function (el) {
      if (!el.dataset.relative) {
        if (!/\bago\s*$/.test(el.textContent)) return;  // absolute times stay as they are
        el.dataset.relative = "1";
      }
      var at = Date.parse(el.getAttribute("datetime"));
      if (!isNaN(at)) el.textContent = since(Math.max(0, (now - at) / 1000));
    });
  }
  setInterval(relativeTimes, 30000);
  document.addEventListener("DOMContentLoaded", relativeTimes);
  document.addEventListener("htmx:afterSettle", relativeTimes);

  // Snooze "until tomorrow" is 09:00 where the reviewer is: each snooze form (the claim bar,
  // approvals/_triage.html) sends the browser's IANA time zone in its hidden `tz`, and, where
  // the form says the server reads zones at all (data-zones: it has a time zone database),
  // its option names the zone. Filled when a form appears and again as it is sent (before
  // htmx reads its fields); without this file, or for a zone the server does not know, it is
  // UTC (the confirmation names the zone used). Runs on every settle: it writes only what
  // differs, so an open menu is not redrawn under the pointer.
  function timeZone() {
    try { return Intl.DateTimeFormat().resolvedOptions().timeZone || ""; } catch (err) { return ""; }
  }
  function fillSnoozeZone(form) {
    var zone = timeZone();
    var input = form.querySelector("input[name=tz][data-time-zone]");
    if (!zone || !input) return;
    if (input.value !== zone) input.value = zone;
    var option = form.hasAttribute("data-zones") && form.querySelector("option[data-tomorrow]");
    var label = "until tomorrow 09:00 " + zone;
    if (option && option.textContent !== label) option.textContent = label;
  }
  function fillSnoozeZones() { document.querySelectorAll("form.snooze").forEach(fillSnoozeZone); }
  document.addEventListener("DOMContentLoaded", fillSnoozeZones);
  document.addEventListener("htmx:afterSettle", fillSnoozeZones);
  document.addEventListener("htmx:oobAfterSwap", fillSnoozeZones);
  document.addEventListener("submit", function (e) {
    if (e.target.matches && e.target.matches("form.snooze")) fillSnoozeZone(e.target);
  }, true);

  // The inbox's Filters menu (a <details>, approvals/inbox.html) closes as a menu does: on
  // Escape, and on a click outside it. Focus goes back to its summary (the menu's button)
  // when it was in the menu or nowhere, never away from what a click outside chose. Capture
  // phase, and the key marked handled, so the keys (inbox-keys.js) do not act on it too.
  function openFilterBox() {
    var box = document.getElementById("filter-box");
    return box && box.open ? box : null;
  }
  function closeFilterBox(box) {
    var active = document.activeElement;
    var refocus = !active || active === document.body || box.contains(active);
    box.open = false;
    var summary = box.querySelector("summary");
    if (refocus && summary) summary.focus();
  }
  document.addEventListener("keydown", function (e) {
    if (e.key !== "Escape" || e.defaultPrevented) return;
    var box = openFilterBox();
    var active = document.activeElement;
    if (!box || (active && active !== document.body && !box.contains(active))) return;
    e.preventDefault();
    closeFilterBox(box);
  }, true);
  document.addEventListener("click", function (e) {
    var box = openFilterBox();
    if (box && !box.contains(e.target)) closeFilterBox(box);
  });
})();
