// The submission form: a field per template parameter, and a live estimate beside it.
// The body sent to POST /api/estimates/ is the one portal/job_form.py builds from the same
// fields on submit, so the estimate is of the job the button submits.
(function () {
  "use strict";
  const form = document.getElementById("job-form");
  const panel = document.getElementById("estimate-panel");
  if (!form || !panel) return;
  const body = document.getElementById("estimate-body");
  const status = document.getElementById("estimate-status");
  const chart = document.getElementById("estimate-chart");
  const PLAIN = ["name", "accelerator", "gpus_per_node", "nodes", "total_steps", "tolerance",
    "max_price_per_hour", "deadline", "checkpoint_every_steps", "checkpoint_every_seconds",
    "max_interruptions", "max_wait_s"];
  const FLAGS = ["allow_model_parallel", "allow_on_demand_fallback"];
  const SOURCES = { history: "this pool's own history", borrowed: "borrowed from similar pools",
    default: "a default: no similar history", pool: "set on the pool by hand" };

  function value(name) {
    const field = form.elements.namedItem(name);
    if (!field) return "";
    return (field.value || "").trim();  // a RadioNodeList's value is the checked one's
  }
  function lines(name) { return value(name).split("\n").map((l) => l.trim()).filter(Boolean); }
  function number(text) { const n = Number(text); return text !== "" && Number.isFinite(n) ? n : text; }

  function workload() {
    if (value("workload_kind") === "command") {
      const w = { command: lines("command"), mode: "directory" };
      if (lines("resume_args").length) w.resume_args = lines("resume_args");
      if (value("progress_pattern")) w.progress_pattern = value("progress_pattern");
      return w;
    }
    const template = value("template");
    const params = {};
    const prefix = `param-${template}-`;
    form.querySelectorAll(`input[name^="${prefix}"]`).forEach(function (input) {
      if (input.value.trim() !== "") params[input.name.slice(prefix.length)] = number(input.value.trim());
    });
    return { template: template, params: params };
  }

  function jobBody() {
    const job = { workload: workload() };
    PLAIN.forEach(function (name) {
      const v = value(name);
      if (v) job[name] = name === "deadline" && v.length <= 19 ? v + "Z" : v;
    });
    FLAGS.forEach(function (name) { job[name] = form.elements.namedItem(name).checked; });
    return job;
  }

  // Show the chosen template's parameters, or the command's fields.
  function showWorkload() {
    const kind = value("workload_kind") || "template";
    form.querySelectorAll("[data-kind]").forEach(function (el) { el.hidden = el.dataset.kind !== kind; });
    form.querySelectorAll("[data-template]").forEach(function (el) {
      el.hidden = el.dataset.template !== value("template");
    });
  }

  function clearErrors() {
    form.querySelectorAll("p.error").forEach(function (p) { p.textContent = ""; });
    form.querySelectorAll("[aria-invalid]").forEach(function (el) { el.removeAttribute("aria-invalid"); });
  }

  function showErrors(errors) {
    Object.entries(errors).forEach(function ([name, messages]) {
      let text = Array.isArray(messages) ? messages.join(" ") : String(messages);
      let target = name;
      if (name === "workload" && value("workload_kind") !== "command") {
        const param = form.querySelector(`input[name^="param-${value("template")}-"][name$="-${text.split(" ")[0]}"]`);
        if (param) target = param.name;  // "seed must be at least 0" goes next to seed
      }
      const slot = document.getElementById("error-" + target) || document.getElementById("error-non_field_errors");
      slot.textContent = text;
      const input = form.elements.namedItem(target);
      if (input && input.setAttribute) input.setAttribute("aria-invalid", "true");
    });
  }

  function money(v) {
    if (v === null || v === undefined) return "never finishes";
    if (v >= 100) return "$" + v.toFixed(0);
    if (v >= 1) return "$" + v.toFixed(2);
    return "$" + Number(v.toPrecision(2));
  }
  function duration(hours) {
    if (hours === null || hours === undefined) return "—";
    if (hours >= 48) return (hours / 24).toFixed(1) + " days";
    if (hours >= 1) return hours.toFixed(1) + " h";
    if (hours * 60 >= 1) return (hours * 60).toFixed(0) + " min";
    return Math.max(1, Math.round(hours * 3600)) + " s";
  }

  function cell(row, text, tag) {
    const el = document.createElement(tag || "td");
    el.textContent = text;
    row.appendChild(el);
  }

  function renderEstimate(e) {
    body.replaceChildren();
    const spot = e.spot, od = e.on_demand;
    const table = document.createElement("table");
    table.className = "data estimate";
    table.id = "estimate";
    const head = table.createTHead().insertRow();
    ["", "Spot", "On-demand"].forEach((t) => cell(head, t, "th"));
    const rows = [
      ["Expected cost", money(spot.expected_cost), money(od.expected_cost)],
      ["Expected time", duration(spot.expected_hours), duration(od.expected_hours)],
      ["P90 time", duration(spot.p90_hours), duration(od.p90_hours)],
      ["Interruptions", spot.expected_interruptions.toFixed(1), "0"],
      ["Lost work", duration(spot.expected_lost_hours), "0"],
    ];
    const tbody = table.createTBody();
    rows.forEach(function (r) { const row = tbody.insertRow(); cell(row, r[0], "th"); cell(row, r[1]); cell(row, r[2]); });
    body.appendChild(table);

    const verdict = document.createElement("p");
    verdict.className = "verdict";
    verdict.id = "recommendation";
    const onSpot = e.recommendation === "spot";
    let words = onSpot ? "Run on spot" : "Run on on-demand";
    if (onSpot && spot.expected_cost !== null && od.expected_cost > 0) {
      const saved = Math.round((1 - spot.expected_cost / od.expected_cost) * 100);
      if (saved > 0) words += `: about ${saved}% cheaper than on-demand`;
    }
    verdict.textContent = words + `. Checkpoint every ${duration(e.checkpoint_interval_s / 3600)}.`;
    body.appendChild(verdict);

    const rate = document.createElement("p");
    rate.className = "muted";
    let source = SOURCES[e.interruption_rate_source] || e.interruption_rate_source;
    if (e.interruption_rate_borrowed_from && e.interruption_rate_borrowed_from.length) {
      source += " (" + e.interruption_rate_borrowed_from.join(", ") + ")";
    }
    rate.textContent = `Spot interrupted about ${Number(e.interruption_rate_per_hour.toPrecision(2))} times an hour; that rate is ${source}.`;
    body.appendChild(rate);

    const reasons = document.createElement("ul");
    reasons.className = "reasons";
    e.reasons.forEach(function (r) { const li = document.createElement("li"); li.textContent = r; reasons.appendChild(li); });
    body.appendChild(reasons);
    drawChart(e);
  }

  // Two pairs of bars: cost, and time with the P90 as a whisker. Plain SVG, no library.
  function drawChart(e) {
    const NS = "http://www.w3.org/2000/svg";
    const width = 320, rowH = 18, left = 86;
    chart.replaceChildren();
    chart.setAttribute("viewBox", `0 0 ${width} 130`);
    const groups = [
      { title: "Cost", unit: money, bars: [["spot", e.spot.expected_cost], ["on-demand", e.on_demand.expected_cost]] },
      { title: "Time (P90)", unit: duration, bars: [["spot", e.spot.expected_hours, e.spot.p90_hours], ["on-demand", e.on_demand.expected_hours, e.on_demand.p90_hours]] },
    ];
    let y = 4;
    groups.forEach(function (g) {
      const max = Math.max(...g.bars.map((b) => Math.max(b[1] || 0, b[2] || 0)), 1e-12);
      const title = document.createElementNS(NS, "text");
      title.setAttribute("x", 0); title.setAttribute("y", y + 11); title.setAttribute("class", "chart-title");
      title.textContent = g.title; chart.appendChild(title);
      y += 16;
      g.bars.forEach(function (b) {
        const scale = (width - left - 110) / max;
        const label = document.createElementNS(NS, "text");
        label.setAttribute("x", 0); label.setAttribute("y", y + 13); label.textContent = b[0];
        chart.appendChild(label);
        const rect = document.createElementNS(NS, "rect");
        rect.setAttribute("x", left); rect.setAttribute("y", y + 2);
        rect.setAttribute("height", rowH - 6); rect.setAttribute("width", Math.max(1, (b[1] || 0) * scale));
        rect.setAttribute("class", b[0] === "spot" ? "bar-spot" : "bar-od");
        chart.appendChild(rect);
        let end = left + (b[1] || 0) * scale;
        const p90 = b[2] && b[2] > (b[1] || 0) ? b[2] : null;
        if (p90) {
          const whisker = document.createElementNS(NS, "line");
          whisker.setAttribute("x1", end); whisker.setAttribute("x2", left + p90 * scale);
          whisker.setAttribute("y1", y + rowH / 2 - 1); whisker.setAttribute("y2", y + rowH / 2 - 1);
          whisker.setAttribute("class", "whisker");
          chart.appendChild(whisker);
          end = left + p90 * scale;
        }
        const value = document.createElementNS(NS, "text");
        value.setAttribute("x", end + 4); value.setAttribute("y", y + 13);
        value.textContent = g.unit(b[1]) + (p90 ? ` (${g.unit(p90)})` : "");
        chart.appendChild(value);
        y += rowH;
      });
      y += 6;
    });
    chart.removeAttribute("hidden");
  }

  let timer = null;
  let pending = null;
  function refresh() {
    if (pending) pending.abort();
    pending = new AbortController();
    const mine = pending;
    status.textContent = "updating…";
    fetch(panel.dataset.url, {
      method: "POST",
      signal: mine.signal,
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", Accept: "application/json",
        "X-CSRFToken": form.elements.namedItem("csrfmiddlewaretoken").value },
      body: JSON.stringify(jobBody()),
    }).then(function (response) {
      return response.json().then(function (data) { return [response.status, data]; });
    }).then(function ([code, data]) {
      if (mine !== pending) return;
      clearErrors();
      status.textContent = "";
      if (code === 200) { renderEstimate(data); return; }
      chart.setAttribute("hidden", "");
      const note = document.createElement("p");
      note.className = code === 409 ? "error" : "muted";
      note.textContent = code === 409 ? data.detail : "Fix the fields marked in red to see an estimate.";
      body.replaceChildren(note);
      if (code === 400) showErrors(data);
    }).catch(function (error) {
      if (error.name !== "AbortError") status.textContent = "could not reach the server";
    });
  }
  function soon() { clearTimeout(timer); timer = setTimeout(refresh, 350); }

  form.addEventListener("input", soon);
  form.addEventListener("change", function (event) {
    if (event.target.name === "template" || event.target.name === "workload_kind") showWorkload();
    soon();
  });
  document.getElementById("estimate-button").hidden = true;  // the panel keeps itself current
  showWorkload();
  refresh();
})();
