// The Notifications page's "Turn on push on this device": registers the app's service worker
// (sw.js, served at the app's root so that its scope is the whole app), subscribes with the
// server's public VAPID key and POSTs the subscription (endpoint and keys) with the CSRF
// token. The server answers 400 with the reason when it refuses one.
(function () {
  "use strict";
  var box = document.getElementById("push-device");
  if (!box) return;
  var button = document.getElementById("push-on");
  var status = document.getElementById("push-status");

  function say(text) { status.textContent = text; }

  function cookie(name) {
    var found = document.cookie.split("; ").filter(function (c) { return c.indexOf(name + "=") === 0; })[0];
    return found ? decodeURIComponent(found.slice(name.length + 1)) : "";
  }

  function keyBytes(base64url) {
    var padded = (base64url + "===".slice((base64url.length + 3) % 4)).replace(/-/g, "+").replace(/_/g, "/");
    var raw = atob(padded);
    var bytes = new Uint8Array(raw.length);
    for (var i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
    return bytes;
  }

  function sameKey(subscription, key) {
    var theirs = subscription.options && subscription.options.applicationServerKey;
    if (!theirs) return false;
    theirs = new Uint8Array(theirs);
    if (theirs.length !== key.length) return false;
    for (var i = 0; i < key.length; i++) if (theirs[i] !== key[i]) return false;
    return true;
  }

  if (!("serviceWorker" in navigator) || !("PushManager" in window) || !window.isSecureContext) {
    button.disabled = true;
    say("This browser cannot get push here: it needs Web Push, and an HTTPS page (or localhost).");
    return;
  }

  button.addEventListener("click", function () {
    var key = keyBytes(box.dataset.publicKey);
    button.disabled = true;
    say("Asking this browser…");
    Notification.requestPermission().then(function (permission) {
      if (permission !== "granted") throw new Error("notifications are blocked for this site in the browser's settings");
      return navigator.serviceWorker.register(box.dataset.workerUrl, { scope: box.dataset.scope });
    }).then(function () {
      return navigator.serviceWorker.ready;
    }).then(function (registration) {
      var manager = registration.pushManager;
      return manager.getSubscription().then(function (existing) {
        if (existing && sameKey(existing, key)) return existing;
        // One made with another server key (the keys were changed) cannot be reused.
        var gone = existing ? existing.unsubscribe() : Promise.resolve();
        return gone.then(function () {
          return manager.subscribe({ userVisibleOnly: true, applicationServerKey: key });
        });
      });
    }).then(function (subscription) {
      return fetch(box.dataset.subscribeUrl, {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-CSRFToken": cookie("csrftoken") },
        body: JSON.stringify(subscription.toJSON()),
      });
    }).then(function (response) {
      return response.json().catch(function () { return {}; }).then(function (answer) {
        if (!response.ok) throw new Error(answer.error || "the server answered " + response.status);
        say("Push is on for this browser.");
        window.location.reload();  // the list of browsers, and the server's message
      });
    }).catch(function (error) {
      button.disabled = false;
      say("Push was not turned on: " + (error && error.message ? error.message : error));
    });
  });
})();
