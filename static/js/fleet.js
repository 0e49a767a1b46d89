// The fleet page, live: every job's events over /ws/fleet/ (newest first), and the
// server-rendered instances and pools re-fetched after each one (decision 070).
(function () {
  "use strict";
  const feed = document.getElementById("feed");
  if (!feed) return;
  const parts = document.getElementById("fleet-parts");
  const refreshParts = window.BatonLive.refresher(parts);
  const refreshPools = window.BatonLive.refresher(document.getElementById("fleet-pools"));
  function refresh() { refreshParts(); refreshPools(); }
  let lastId = Number(feed.dataset.since);

  function show(event) {
    if (event.id <= lastId) return;
    lastId = event.id;
    const li = window.BatonLive.item(event);
    const job = document.createElement("a");
    job.href = `/jobs/${event.job}/`;
    job.textContent = `job ${event.job}`;
    li.insertBefore(job, li.querySelector("strong"));
    li.insertBefore(document.createTextNode(" "), li.querySelector("strong"));
    feed.insertBefore(li, feed.firstChild);
    while (feed.children.length > 200) feed.removeChild(feed.lastChild);
  }

  window.BatonLive.connect("/ws/fleet/", {
    status: document.getElementById("live-status"),
    since: function () { return lastId; },
    onOpen: refresh,
    onMessage: function (payload) {
      if (payload.type !== "timeline.event") return;
      show(payload.event);
      refresh();
    },
  });
})();
