// A resumable websocket of timeline events (DESIGN §8, decision 070): on every (re)connect it
// asks for the events after the last one the page has, and it reconnects with a jittered
// back-off from 1 s to 15 s, saying so in the page's connection indicator.
window.BatonLive = (function () {
  "use strict";

  function connect(path, page) {
    let retryMs = 1000;
    function setStatus(kind, text) {
      if (!page.status) return;
      page.status.dataset.state = kind;
      page.status.textContent = text;
    }
    function open() {
      const scheme = location.protocol === "https:" ? "wss" : "ws";
      const socket = new WebSocket(`${scheme}://${location.host}${path}`);
      api.socket = socket;  // the page's current socket, for the console and the browser test
      socket.onopen = function () {
        setStatus("live", "live");
        retryMs = 1000;
        socket.send(JSON.stringify({ type: "resume", since: page.since() }));
        if (page.onOpen) page.onOpen();
      };
      socket.onmessage = function (message) { page.onMessage(JSON.parse(message.data)); };
      socket.onclose = function () {
        const wait = retryMs * (0.75 + Math.random() / 2);
        setStatus("reconnecting", `reconnecting in ${Math.round(wait / 1000)} s…`);
        setTimeout(open, wait);
        retryMs = Math.min(retryMs * 2, 15000);
      };
    }
    open();
  }

  // An event's data in a few words.
  function describe(event) {
    const d = event.data || {};
    switch (event.kind) {
      case "replica_ready":
        return [d.region && `in ${d.region}`, d.source && `from ${d.source}`, d.note].filter(Boolean).join(" · ");
      case "rollback":
        return `from step ${d.from_step} to step ${d.to_step}` + (d.reason ? ` · ${d.reason}` : "");
      case "validation_passed":
      case "validation_failed": {
        const integrity = d.integrity || {};
        return [integrity.ok === false ? "chunks corrupt" : integrity.ok ? "chunks verified" : "",
          d.note || d.reason].filter(Boolean).join(" · ");
      }
      case "notice_advance":
      case "notice_final": {
        const next = d.target && typeof d.target === "object"
          ? `next: ${d.target.instance_type || "a pool"} in ${d.target.region || "?"}` : "";
        return [d.source && `from ${d.source}`, d.rank !== undefined && `rank ${d.rank}`, next, d.reason]
          .filter(Boolean).join(" · ");
      }
      case "succeeded":
        return `step ${d.step} · validation loss ${Number(d.val_loss).toPrecision(5)}`;
      case "restore_done":
        return `from step ${d.step}`;
      case "instance_started":
        return `instance ${d.instance} · rank ${d.rank}`;
      case "checkpoint_committed":
      case "checkpoint_missed":
        return `step ${d.step}` + (d.lost_steps ? ` · ${d.lost_steps} steps lost` : "");
    }
    return d.reason || d.error || Object.entries(d)
      .filter(([k]) => k !== "reason")
      .map(([k, v]) => `${k}: ${typeof v === "object" ? JSON.stringify(v) : v}`)
      .join(" · ");
  }

  // One <li> of a timeline list.
  function item(event) {
    const li = document.createElement("li");
    li.className = "event kind-" + event.kind;
    li.dataset.id = event.id;
    li.innerHTML = '<time></time> <strong></strong> <span class="muted"></span>';
    li.querySelector("time").textContent = new Date(event.at).toLocaleTimeString();
    li.querySelector("time").dateTime = event.at;
    li.querySelector("strong").textContent = event.kind.replace(/_/g, " ");
    li.querySelector("span").textContent = describe(event);
    return li;
  }

  // Re-render a server-rendered part: one request at a time, the latest wins.
  function refresher(element, after) {
    let timer = null;
    return function () {
      clearTimeout(timer);
      timer = setTimeout(function () {
        fetch(element.dataset.url, { credentials: "same-origin" })
          .then((r) => (r.ok ? r.text() : Promise.reject(r.status)))
          .then(function (html) { element.innerHTML = html; if (after) after(); })
          .catch(function () { /* the next event tries again */ });
      }, 250);
    };
  }

  const api = { connect: connect, describe: describe, item: item, refresher: refresher, socket: null };
  return api;
})();
