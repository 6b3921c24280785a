// flask_sqlqueue admin: auto-refresh that can be paused, select-all, confirmations.
// Loaded with <script src>; the pages work without it.
(function () {
  "use strict";
  var PAUSED_KEY = "sqlqueue-refresh-paused";

  function paused() {
    try { return window.localStorage.getItem(PAUSED_KEY) === "1"; } catch (e) { return false; }
  }
  function setPaused(value) {
    try {
      if (value) { window.localStorage.setItem(PAUSED_KEY, "1"); }
      else { window.localStorage.removeItem(PAUSED_KEY); }
    } catch (e) { /* storage refused: the choice lasts for this page only */ }
  }

  function setupRefresh() {
    var seconds = parseInt(document.body.getAttribute("data-refresh") || "0", 10);
    var button = document.getElementById("sqlqueue-refresh");
    if (!seconds || !button) { return; }
    var timer = null;
    var state = paused();
    function render() {
      button.textContent = state ? "Resume auto-refresh" : "Pause auto-refresh (every " + seconds + " s)";
      button.setAttribute("aria-pressed", state ? "true" : "false");
    }
    function schedule() {
      if (timer) { window.clearTimeout(timer); timer = null; }
      if (!state) {
        timer = window.setTimeout(function () {
          if (!paused() && document.visibilityState !== "hidden") { window.location.reload(); }
          else { schedule(); }
        }, seconds * 1000);
      }
    }
    button.addEventListener("click", function () {
      state = !state;
      setPaused(state);
      render();
      schedule();
    });
    button.hidden = false;
    render();
    schedule();
  }

  function setupSelectAll() {
    var boxes = document.querySelectorAll("input[data-select-all]");
    Array.prototype.forEach.call(boxes, function (all) {
      var form = all.form;
      if (!form) { return; }
      all.hidden = false;
      all.addEventListener("change", function () {
        Array.prototype.forEach.call(form.querySelectorAll("input[name=ids]"), function (box) {
          box.checked = all.checked;
        });
      });
    });
  }

  function setupConfirm() {
    document.addEventListener("submit", function (event) {
      var form = event.target;
      var submitter = event.submitter;
      var message = (submitter && submitter.getAttribute("data-confirm")) ||
        form.getAttribute("data-confirm");
      if (message && !window.confirm(message)) { event.preventDefault(); }
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    setupRefresh();
    setupSelectAll();
    setupConfirm();
  });
})();
