/* Admin lock viewer: counts leases down, selects all rows, and auto-refreshes. */
"use strict";
(function () {
  const started = performance.now();

  function format(seconds) {
    if (seconds <= 0) return "expired";
    if (seconds < 60) return Math.ceil(seconds) + " s";
    if (seconds < 3600) return Math.floor(seconds / 60) + " min " + Math.floor(seconds % 60) + " s";
    return Math.floor(seconds / 3600) + " h " + Math.floor((seconds % 3600) / 60) + " min";
  }

  function tick() {
    const elapsed = (performance.now() - started) / 1000;
    for (const el of document.querySelectorAll(".redislock-lease[data-lease]")) {
      const left = parseFloat(el.dataset.lease) - elapsed;
      el.textContent = format(left);
      el.classList.toggle("expired", left <= 0);
    }
  }

  function setUpToggle() {
    const toggle = document.getElementById("action-toggle");
    if (!toggle) return;
    toggle.addEventListener("change", function () {
      for (const box of document.querySelectorAll("input.action-select")) box.checked = toggle.checked;
    });
  }

  function setUpRefresh() {
    const main = document.getElementById("content-main");
    const period = main ? parseInt(main.dataset.refresh || "0", 10) : 0;
    if (!period) return;
    window.setInterval(function () {
      // Do not throw away what the operator is doing: a selection or a focused field.
      const busy = document.querySelector("input.action-select:checked") ||
        (document.activeElement && ["INPUT", "SELECT"].includes(document.activeElement.tagName));
      if (!busy) window.location.reload();
    }, period * 1000);
  }

  document.addEventListener("DOMContentLoaded", function () {
    tick();
    window.setInterval(tick, 1000);
    setUpToggle();
    setUpRefresh();
  });
})();
