// Live timeline of one job: the resume protocol of DESIGN §8 over /ws/jobs/<id>/.
// On every (re)connect the page asks for what it missed since the last event it showed.
(function () {
  "use strict";
  const list = document.getElementById("timeline");
  if (!list) return;
  const status = document.getElementById("live-status");
  const jobId = list.dataset.job;
  let lastId = 0;
  let retryMs = 1000;

  function describe(event) {
    const d = event.data || {};
    return d.reason || d.error || Object.entries(d)
      .filter(([k]) => k !== "reason")
      .map(([k, v]) => `${k}: ${typeof v === "object" ? JSON.stringify(v) : v}`)
      .join(" · ");
  }

  function show(event) {
    if (event.id <= lastId) return;
    lastId = event.id;
    const item = document.createElement("li");
    item.className = "event kind-" + event.kind;
    item.dataset.id = event.id;
    const when = new Date(event.at).toLocaleTimeString();
    item.innerHTML = '<time></time> <strong></strong> <span class="muted"></span>';
    item.querySelector("time").textContent = when;
    item.querySelector("strong").textContent = event.kind.replace(/_/g, " ");
    item.querySelector("span").textContent = describe(event);
    list.appendChild(item);
  }

  function showState(state) {
    const badge = document.getElementById("job-state");
    if (!badge) return;
    badge.className = "state state-" + state;
    badge.textContent = state.charAt(0).toUpperCase() + state.slice(1).replace(/_/g, " ");
  }

  function connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const socket = new WebSocket(`${scheme}://${location.host}/ws/jobs/${jobId}/`);
    socket.onopen = function () {
      status.textContent = "live";
      retryMs = 1000;
      socket.send(JSON.stringify({ type: "resume", since: lastId }));
    };
    socket.onmessage = function (message) {
      const payload = JSON.parse(message.data);
      if (payload.type === "timeline.event") {
        show(payload.event);
        if (payload.state) showState(payload.state);
      }
      if (payload.type === "job.state") showState(payload.state);
      if (payload.type === "job.progress") {
        const step = document.getElementById("job-step");
        if (step) step.textContent = payload.step;
      }
    };
    socket.onclose = function () {
      status.textContent = "reconnecting…";
      setTimeout(connect, retryMs);
      retryMs = Math.min(retryMs * 2, 15000);
    };
  }
  connect();
})();
