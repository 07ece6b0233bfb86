// Small progressive enhancements; every page works without this file.
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

  // After an in-place decision, keep keyboard focus on the card that changed.
  document.addEventListener("htmx:afterSwap", function (e) {
    var card = e.detail && e.detail.target;
    if (card && card.id && card.id.indexOf("request-") === 0) {
      var fresh = document.getElementById(card.id);
      if (fresh) { fresh.setAttribute("tabindex", "-1"); fresh.focus({ preventScroll: true }); }
    }
  });
})();
