// Belay console: the one script. No framework, no network but the engine.
//
// Live updates: an element with `data-live` is refreshed every
// `data-live-ms` milliseconds (default 2000) from the same URL with
// `partial=1`, which answers with that element's new inner HTML. A refresh
// is skipped while focus is inside the element (someone is reading or
// typing there) or the tab is hidden, and `<details>` keep their state.
// When a refresh fails the element is marked `data-live-state="stale"` and
// a status line above it says why and since when (the session ended: a
// link to sign in again; the engine answered an error or could not be
// reached: refreshing goes on and the line goes once a refresh succeeds).
(function () {
  "use strict";

  function statusLine(el) {
    var line = el.previousElementSibling;
    if (line && line.classList.contains("live-status")) {
      return line;
    }
    line = document.createElement("p");
    line.className = "live-status";
    line.setAttribute("role", "status");
    line.hidden = true;
    el.parentNode.insertBefore(line, el);
    return line;
  }

  function markStale(el, why, signIn) {
    var line = statusLine(el);
    if (el.getAttribute("data-live-state") !== "stale") {
      el.setAttribute("data-live-since", new Date().toLocaleTimeString());
    }
    el.setAttribute("data-live-state", "stale");
    line.textContent = "Not live since " + el.getAttribute("data-live-since") +
      ": " + why + ". What you see may be out of date. ";
    if (signIn) {
      var a = document.createElement("a");
      a.href = "/console/login?next=" +
        encodeURIComponent(window.location.pathname + window.location.search);
      a.textContent = "Sign in again";
      line.appendChild(a);
    }
    line.hidden = false;
  }

  function markFresh(el) {
    statusLine(el).hidden = true;
    el.setAttribute("data-live-state", "fresh");
    el.setAttribute("data-live-at", String(Date.now()));
  }

  function partialUrl() {
    var url = new URL(window.location.href);
    url.searchParams.set("partial", "1");
    url.searchParams.delete("notice");
    return url.toString();
  }

  function refresh(el) {
    if (document.hidden || el.contains(document.activeElement)) {
      return Promise.resolve();
    }
    var open = {};
    el.querySelectorAll("details[id]").forEach(function (d) {
      open[d.id] = d.open;
    });
    return fetch(partialUrl(), {
      credentials: "same-origin",
      headers: { "X-Belay-Partial": "1" },
    }).then(function (r) {
      if (r.status === 303 || r.redirected || r.status === 401) {
        markStale(el, "the session ended", true);
        return;
      }
      if (!r.ok) {
        markStale(el, "the engine answered " + r.status + ", retrying", false);
        return;
      }
      return r.text().then(function (html) {
        el.innerHTML = html;
        el.querySelectorAll("details[id]").forEach(function (d) {
          if (Object.prototype.hasOwnProperty.call(open, d.id)) {
            d.open = open[d.id];
          }
        });
        markFresh(el);
      });
    }).catch(function () {
      markStale(el, "the engine cannot be reached, retrying", false);
    });
  }

  function startLive(el) {
    var ms = parseInt(el.getAttribute("data-live-ms") || "2000", 10);
    var tick = function () {
      refresh(el).then(function () {
        window.setTimeout(tick, ms);
      });
    };
    window.setTimeout(tick, ms);
  }

  // Verdict forms: show only the fields of the chosen verdict.
  function wireVerdicts(form) {
    var update = function () {
      var chosen = form.querySelector("input[name=resolution]:checked");
      var value = chosen ? chosen.value : "";
      form.querySelectorAll("[data-for]").forEach(function (field) {
        var show = field.getAttribute("data-for") === value;
        field.hidden = !show;
        field.querySelectorAll("textarea, input").forEach(function (input) {
          input.disabled = !show;
        });
      });
    };
    form.addEventListener("change", update);
    update();
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-live]").forEach(startLive);
    document.querySelectorAll("form[data-verdicts]").forEach(wireVerdicts);
  });
})();
