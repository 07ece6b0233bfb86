// The app's service worker, served at the app's root (the `approvals:service-worker` URL) so
// that its scope covers the app's pages. It only shows what the server pushed and, on a
// click, brings up the request's page; a push about one request has Approve / Decline
// buttons, each opening its signed link's confirmation page: nothing is decided from a push
// or a click.
"use strict";

self.addEventListener("install", function () {
  self.skipWaiting();  // a new version takes over at once: it holds no state
});

self.addEventListener("activate", function (event) {
  event.waitUntil(self.clients.claim());
});

self.addEventListener("push", function (event) {
  var data = {};
  if (event.data) {
    try {
      data = event.data.json();
    } catch (error) {
      data = { body: event.data.text() };
    }
  }
  var links = {};
  var buttons = [];
  (Array.isArray(data.actions) ? data.actions : []).forEach(function (a) {
    if (a && a.action && a.url) {
      links[a.action] = a.url;
      buttons.push({ action: a.action, title: a.title || a.action });
    }
  });
  var options = {
    body: data.body || "",
    data: { url: data.url || self.registration.scope, links: links },
  };
  if (buttons.length) options.actions = buttons;
  if (data.icon) options.icon = data.icon;
  if (data.tag) options.tag = data.tag;
  event.waitUntil(self.registration.showNotification(data.title || "toolnexus", options));
});

// The page to open, on this origin whatever the server's public address says: a push can
// bring up a page of this app and nothing else.
function pageOf(notification, action) {
  var data = notification.data || {};
  var chosen = action && data.links && data.links[action];
  var url = new URL(chosen || data.url || self.registration.scope, self.registration.scope);
  if (url.origin !== self.location.origin) url = new URL(url.pathname + url.search + url.hash, self.location.origin);
  return url.href;
}

self.addEventListener("notificationclick", function (event) {
  event.notification.close();
  var target = pageOf(event.notification, event.action);
  event.waitUntil(
    self.clients.matchAll({ type: "window", includeUncontrolled: true }).then(function (tabs) {
      // A tab already on that page is brought forward; another tab of the app is left as it
      // is (it may hold a half-typed reason), and the page opens in a new one.
      for (var i = 0; i < tabs.length; i++) {
        if (tabs[i].url === target && "focus" in tabs[i]) return tabs[i].focus();
      }
      return self.clients.openWindow(target);
    })
  );
});
