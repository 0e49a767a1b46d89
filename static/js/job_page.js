// A job's page, live: the timeline and each migration's phases over /ws/jobs/<id>/ (the
// resume protocol: on every (re)connect ask for what came after the last event shown), the
// page's changing parts re-rendered by the server as events arrive, and the log tailed from
// GET /api/jobs/<id>/logs/?since= whenever the socket says lines came. Decision 070.
(function () {
  "use strict";
  const list = document.getElementById("timeline");
  if (!list) return;
  const jobId = list.dataset.job;
  const status = document.getElementById("live-status");
  const parts = document.getElementById("job-parts");
  const rows = document.getElementById("phase-rows");
  const log = document.getElementById("log");
  const cancel = document.getElementById("cancel-form");
  const FINISHED = ["succeeded", "failed", "cancelled"];
  // The phase of a migration each event begins (it ends the one before): the advance notice
  // opens the notice, the final notice the emergency checkpoint, its commit the release, the
  // release the placement, the placement the replica copy, the copy the start, the start the
  // restore, the restore the validation, and a passed validation the run.
  const PHASE = {
    notice_advance: "notice", notice_final: "checkpoint", checkpoint_started: "checkpoint",
    checkpoint_committed: "release", checkpoint_missed: "release", released: "placement",
    waiting: "placement", fallback_on_demand: "placement", placement_decided: "replica",
    replica_ready: "start", instance_started: "restore", rollback: "restore",
    validation_failed: "restore", restore_done: "validation", validation_passed: "running",
    running: "running", succeeded: "running", failed: "failed", cancelled: "failed",
  };
  const events = [];
  let lastId = 0;
  let state = null;

  function showEvent(event) {
    const atBottom = list.scrollHeight - list.scrollTop - list.clientHeight < 40;
    list.appendChild(window.BatonLive.item(event));
    if (atBottom) list.scrollTop = list.scrollHeight;
  }

  function seconds(s) { return s >= 90 ? (s / 60).toFixed(1) + " min" : s.toFixed(1) + " s"; }

  // One row per migration: a segment per phase, as wide as the phase took (an open migration's
  // last phase runs to now), on that migration's own time axis.
  function drawRows() {
    const byMigration = new Map();
    events.forEach(function (e) {
      if (e.migration === null || e.migration === undefined) return;
      if (!byMigration.has(e.migration)) byMigration.set(e.migration, []);
      byMigration.get(e.migration).push(e);
    });
    rows.replaceChildren();
    if (!byMigration.size) {
      const none = document.createElement("p");
      none.className = "muted";
      none.textContent = "No migration yet: interrupt an instance (staff) or wait for the market.";
      rows.appendChild(none);
      return false;
    }
    let open = false;
    let n = 0;
    byMigration.forEach(function (items, id) {
      n += 1;
      const times = items.map((e) => Date.parse(e.at));
      const last = items[items.length - 1];
      const done = ["running", "failed"].includes(PHASE[last.kind]);
      open = open || !done;
      const end = done ? times[times.length - 1] : Math.max(Date.now(), times[times.length - 1]);
      const segments = [];
      items.forEach(function (e, i) {
        const phase = PHASE[e.kind] || e.kind;
        const until = i + 1 < items.length ? times[i + 1] : end;
        const prev = segments[segments.length - 1];
        if (prev && prev.phase === phase) { prev.until = until; prev.kinds.push(e.kind); }
        else segments.push({ phase: phase, from: times[i], until: until, kinds: [e.kind] });
      });
      const row = document.createElement("div");
      row.className = "phase-row" + (done ? " done" : " open");
      row.dataset.migration = id;
      const label = document.createElement("div");
      label.className = "phase-label";
      label.textContent = `Migration ${n} · ${seconds((end - times[0]) / 1000)}` + (done ? "" : " so far");
      const bar = document.createElement("div");
      bar.className = "phase-bar";
      segments.forEach(function (s) {
        const seg = document.createElement("span");
        const took = (s.until - s.from) / 1000;
        seg.className = "phase phase-" + s.phase;
        seg.style.flexGrow = String(Math.max(took, 0.05));
        seg.textContent = s.phase;
        seg.title = `${s.phase}: ${seconds(took)} (from ${s.kinds[0].replace(/_/g, " ")})`;
        bar.appendChild(seg);
      });
      row.appendChild(label);
      row.appendChild(bar);
      rows.appendChild(row);
    });
    return open;
  }

  let ticking = null;
  function redraw() {
    const open = drawRows();
    if (open && !ticking) ticking = setInterval(redraw, 1000);
    if (!open && ticking) { clearInterval(ticking); ticking = null; }
  }

  function showState(next) {
    state = next;
    const badge = document.getElementById("job-state");
    if (badge) {
      badge.className = "state state-" + next;
      badge.textContent = next.charAt(0).toUpperCase() + next.slice(1).replace(/_/g, " ");
    }
    if (cancel) cancel.hidden = FINISHED.includes(next);
  }

  const refreshParts = window.BatonLive.refresher(parts, function () { if (state) showState(state); });

  // The log: lines after the last one shown, a marker where a rank moved to a new instance.
  let logSince = Number(log.dataset.since);
  const instanceOfRank = {};
  let fetchingLog = false;
  let logAgain = false;
  function appendLines(lines) {
    const atBottom = log.scrollHeight - log.scrollTop - log.clientHeight < 40;
    const chunk = document.createDocumentFragment();
    lines.forEach(function (line) {
      const before = instanceOfRank[line.rank];
      if (line.instance !== null && before !== undefined && before !== line.instance) {
        const mark = document.createElement("span");
        mark.className = "log-migration";
        mark.textContent = `── rank ${line.rank} moved: instance ${before} → ${line.instance} ──\n`;
        chunk.appendChild(mark);
      }
      if (line.instance !== null) instanceOfRank[line.rank] = line.instance;
      const row = document.createElement("span");
      row.className = "log-line";
      row.dataset.id = line.id;
      row.textContent = `[${line.rank}] ${line.line}\n`;
      chunk.appendChild(row);
      logSince = Math.max(logSince, line.id);
    });
    log.appendChild(chunk);
    if (atBottom) log.scrollTop = log.scrollHeight;
  }
  function refreshLog() {
    if (fetchingLog) { logAgain = true; return; }
    fetchingLog = true;
    fetch(`${log.dataset.url}?since=${logSince}&limit=1000`, { credentials: "same-origin" })
      .then((r) => (r.ok ? r.json() : Promise.reject(r.status)))
      .then(function (lines) {
        appendLines(lines);
        if (lines.length === 1000) logAgain = true;
      })
      .catch(function () { /* retried on the next notification or reconnect */ })
      .finally(function () {
        fetchingLog = false;
        if (logAgain) { logAgain = false; refreshLog(); }
      });
  }

  function onEvent(event, newState) {
    if (event.id <= lastId) return;
    lastId = event.id;
    events.push(event);
    showEvent(event);
    if (newState) showState(newState);
  }

  let replaying = false;
  window.BatonLive.connect(`/ws/jobs/${jobId}/`, {
    status: status,
    since: function () { return lastId; },
    onOpen: function () {
      replaying = true;
      refreshLog();  // lines written while disconnected
    },
    onMessage: function (payload) {
      if (payload.type === "timeline.event") {
        onEvent(payload.event, payload.state);
        if (!replaying) { redraw(); refreshParts(); }
      } else if (payload.type === "job.state") {  // the end of a resume's replay
        replaying = false;
        showState(payload.state);
        redraw();
        refreshParts();
      } else if (payload.type === "job.progress") {
        const step = document.getElementById("job-step");
        const bar = document.getElementById("job-progress");
        if (step) step.textContent = payload.step;
        if (bar) bar.value = payload.step;
      } else if (payload.type === "log.lines") {
        refreshLog();
      }
    },
  });
})();
