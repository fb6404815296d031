// relayq dashboard: reads the JSON API every second and draws the page.
// Every stored string (payloads, errors, output, names) is set with textContent or as
// an attribute value, never parsed as HTML: this file never touches innerHTML.
"use strict";
(() => {
  const meta = (name) => document.querySelector(`meta[name="relayq-${name}"]`).content;
  const base = meta("base");
  const page = meta("page");
  const queue = meta("queue");
  const id = meta("id");
  const readOnly = meta("read-only") === "true";
  const csrf = meta("csrf");
  const params = new URLSearchParams(location.search);
  const limit = params.get("limit") || "50";
  const $ = (sel) => document.querySelector(sel);

  // Builds an element; strings among `children` become text nodes.
  function h(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else if (k === "text") e.textContent = v;
      // Through the CSSOM: the CSP refuses style attributes.
      else if (k === "style") Object.assign(e.style, v);
      else e.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat(Infinity)) {
      if (c === null || c === undefined || c === false) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }
  const q = (name) => encodeURIComponent(name);
  const qpath = (name) => `${base}/queues/${q(name)}`;
  const link = (href, text, cls) => h("a", { href, class: cls }, text);
  const num = (n) => h("td", { class: "num" }, String(n));
  const badge = (text, cls) => h("span", { class: `badge ${cls || text}` }, text);

  function ago(iso) {
    if (!iso) return "";
    const s = Math.round((Date.now() - Date.parse(iso)) / 1000);
    if (s < 0) return `in ${fmtSecs(-s)}`;
    return `${fmtSecs(s)} ago`;
  }
  function fmtSecs(s) {
    if (s < 90) return `${s}s`;
    if (s < 5400) return `${Math.round(s / 60)}m`;
    if (s < 172800) return `${Math.round(s / 3600)}h`;
    return `${Math.round(s / 86400)}d`;
  }
  const when = (iso) => (iso ? h("span", { title: iso }, ago(iso)) : h("span", { class: "muted" }, "—"));

  async function api(path) {
    const r = await fetch(`${base}/api${path}`, { headers: { accept: "application/json" }, credentials: "same-origin" });
    const body = await r.json().catch(() => ({}));
    if (!r.ok) throw new Error(body.error || `${r.status} ${r.statusText}`);
    return body;
  }
  async function post(path, body) {
    const r = await fetch(`${base}/api${path}`, {
      method: "POST",
      credentials: "same-origin",
      headers: { "content-type": "application/json", "x-relayq-csrf": csrf },
      body: JSON.stringify(body || {}),
    });
    const out = await r.json().catch(() => ({}));
    if (!r.ok) throw new Error(out.error || `${r.status} ${r.statusText}`);
    return out;
  }
  async function act(path, body, confirmText) {
    if (confirmText && !window.confirm(confirmText)) return;
    try {
      const out = await post(path, body);
      // An action that did less than asked says why (retry all: jobs that stay dead).
      showError(out.note || null);
    } catch (e) {
      showError(`action failed: ${e.message}`);
    }
    refresh();
  }
  // An action button, or nothing on a read-only dashboard.
  const button = (label, path, body, opts = {}) =>
    readOnly ? null : h("button", { class: opts.danger ? "danger" : null, "data-action": opts.name || label, onclick: () => act(path, body, opts.confirm) }, label);

  function showError(text) {
    const e = $("#error");
    e.hidden = !text;
    e.textContent = text || "";
  }

  function nav() {
    const items = [link(`${base}/`, "queues", page === "queues" ? "current" : null), link(`${base}/workers`, "workers", page === "workers" ? "current" : null)];
    if (queue) {
      for (const [p, label] of [["batches", "batches"], ["jobs", "jobs"], ["running", "running"], ["dead", "dead"], ["schedules", "schedules"], ["charts", "charts"]]) {
        items.push(link(`${qpath(queue)}/${p}`, label, page === p ? "current" : null));
      }
    }
    $("#nav").replaceChildren(...items);
  }

  function moreLink(list) {
    if (!list.more) return null;
    const next = new URLSearchParams(location.search);
    next.set("limit", String(Math.min(Number(limit) * 2, 1000)));
    return h("p", { class: "more" }, `showing the first ${list.items.length}; `, link(`?${next}`, "show more"));
  }

  // ---- pages ----

  const STATES = ["scheduled", "ready", "blocked", "running", "retrying", "succeeded", "dead", "cancelled"];

  function queueActions(s) {
    if (readOnly) return null;
    const input = h("input", { type: "number", min: "1", placeholder: "max", "aria-label": `max_running of ${s.queue}`, "data-field": "max_running" });
    return [
      s.paused
        ? button("resume", `/queues/${q(s.queue)}/resume`, {}, { name: "resume" })
        : button("pause", `/queues/${q(s.queue)}/pause`, {}, { name: "pause" }),
      input,
      h("button", { "data-action": "set-max", onclick: () => {
        const n = Number(input.value);
        if (!Number.isInteger(n) || n < 1) { showError("max_running: enter a whole number of at least 1"); return; }
        act(`/queues/${q(s.queue)}/max-running`, { max_running: n });
      } }, "set max"),
      s.max_running === null ? null : button("clear max", `/queues/${q(s.queue)}/max-running`, { max_running: null }, { name: "clear-max" }),
    ];
  }

  // How long the longest-waiting claimable job has waited, or a dash when none waits.
  function waited(secs) {
    if (secs === null || secs === undefined) return "—";
    if (secs < 60) return `${secs.toFixed(1)} s`;
    if (secs < 3600) return `${Math.floor(secs / 60)} min`;
    return `${(secs / 3600).toFixed(1)} h`;
  }

  // A big queue's counts come from its last count, taken in the background (up to 30 s
  // old); the first one may still be running. Says so, rather than show old figures as
  // current.
  function countNote(s) {
    if (!s.counted) return h("span", { class: "muted counting" }, "counting…");
    const age = s.counted_seconds_ago;
    return age > 2 ? h("span", { class: "muted counted-at", title: s.counted_at }, `counts from ${fmtSecs(Math.round(age))} ago`) : null;
  }

  // Ready jobs and no worker beating for the queue (SPEC M9): nothing will run them.
  // A paused queue says "paused" instead; a queue with no ready job needs no worker.
  const unserved = (s) => s.counted && !s.paused && s.workers === 0 && (s.counts.ready ?? 0) + (s.counts.retrying ?? 0) > 0
    ? badge("no worker", "dead no-worker") : null;

  async function drawWorkers() {
    const list = await api("/workers");
    const rows = list.map((w) =>
      h("tr", { "data-worker": w.worker },
        h("td", {}, w.worker, " ", w.alive ? null : badge("gone", "cancelled")),
        h("td", {}, w.host, h("span", { class: "muted" }, ` pid ${w.pid}`)),
        h("td", {}, w.queues.map((name, i) => [i ? ", " : "", link(`${qpath(name)}/batches`, name)])),
        num(w.slots), num(w.busy), num(w.held),
        h("td", {}, when(w.started_at)),
        h("td", {}, when(w.last_seen))));
    return list.length
      ? [h("table", { id: "workers" }, h("thead", {}, h("tr", {}, ["worker", "host", "queues", "slots", "busy", "held ahead", "started", "last seen"].map((t) => h("th", { title: t === "held ahead" ? "jobs claimed ahead, waiting in its buffer for a slot: leased, not running yet" : null }, t)))), h("tbody", {}, rows)),
        h("p", { class: "muted" }, "Each worker beats every 5 s for each queue it serves; one silent for 15 s is shown as gone, and dropped after an hour.")]
      : h("p", { class: "muted", id: "workers-empty" }, "No worker has beaten in the last hour.");
  }

  async function drawQueues() {
    const extra = params.get("queues");
    const list = await api(`/queues${extra ? `?queues=${q(extra)}` : ""}`);
    const rows = list.map((s) =>
      h("tr", { "data-queue": s.queue },
        h("td", {}, link(`${qpath(s.queue)}/batches`, s.queue), " ", s.paused ? badge("paused") : null, " ", unserved(s), " ", countNote(s)),
        STATES.map((st) => num(s.counted ? s.counts[st] ?? 0 : "…")),
        h("td", { class: "num" }, s.counted ? `${s.running} / ${s.max_running ?? "∞"}` : "…", s.held ? h("span", { class: "muted held", title: "claimed ahead, waiting in a worker's buffer: not started" }, ` (${s.held} held)`) : null),
        h("td", { class: "num oldest" }, s.counted ? waited(s.oldest_ready_seconds) : "…"),
        h("td", {}, link(`${qpath(s.queue)}/jobs`, "jobs"), " · ", link(`${qpath(s.queue)}/running`, "running"), " · ", link(`${qpath(s.queue)}/dead`, "dead")),
        // Until counted, the settings are unknown: no button that could be wrong.
        readOnly ? null : h("td", {}, s.counted ? queueActions(s) : null)));
    const add = h("form", { class: "toolbar", onsubmit: (ev) => {
      ev.preventDefault();
      const name = ev.target.elements.q.value.trim();
      if (!name) return;
      const next = new URLSearchParams(location.search);
      next.set("queues", [extra, name].filter(Boolean).join(","));
      location.search = next.toString();
    } }, "Show another queue: ", h("input", { name: "q", placeholder: "queue", class: "wide" }), " ", h("button", { type: "submit" }, "show"));
    return [
      list.length ? null : h("p", { class: "muted" }, "No queues configured: name one below, or start the dashboard with -q QUEUE."),
      h("table", { id: "queues" },
        h("thead", {}, h("tr", {}, h("th", {}, "queue"), STATES.map((st) => h("th", {}, st)), h("th", {}, "running / max"), h("th", { title: "how long the longest-waiting claimable job has waited" }, "oldest ready"), h("th", {}, "lists"), readOnly ? null : h("th", {}, "actions"))),
        h("tbody", {}, rows)),
      add,
    ];
  }

  function stageBar(st) {
    const total = st.pending + st.running + st.succeeded + st.dead + st.cancelled || 1;
    const part = (n, cls) => (n ? h("span", { class: cls, style: { width: `${(100 * n) / total}%` }, title: `${n} ${cls}` }) : null);
    return h("div", { class: "stage", "data-stage": st.stage },
      h("span", {}, `stage ${st.stage}`),
      h("div", { class: "bar" }, part(st.succeeded, "succeeded"), part(st.dead, "dead"), part(st.cancelled, "cancelled"), part(st.running, "running"), part(st.pending, "pending")),
      h("span", { class: "stage-text" }, `${st.succeeded + st.dead + st.cancelled}/${st.pending + st.running + st.succeeded + st.dead + st.cancelled} done · ${st.running} running · ${st.pending} pending${st.dead ? ` · ${st.dead} dead` : ""}${st.cancelled ? ` · ${st.cancelled} cancelled` : ""}`));
  }
  const batchDone = (b) => b.sealed && b.stages.every((s) => s.pending + s.running === 0);
  // When the batch was opened, and how long it took once done (to its last job's end).
  function batchTimes(b) {
    if (!b.created_at) return null;
    const took = batchDone(b) && b.last_finished_at
      ? ` · took ${fmtSecs(Math.max(0, Math.round((Date.parse(b.last_finished_at) - Date.parse(b.created_at)) / 1000)))}` : "";
    return h("span", { class: "muted batch-times" }, "opened ", when(b.created_at), took);
  }
  function batchState(b) {
    if (b.failed) return badge("failed");
    if (batchDone(b)) {
      // A Continue batch finishes with its dead jobs: say so, not a green "finished".
      const sum = (k) => b.stages.reduce((n, s) => n + s[k], 0);
      if (sum("dead")) return badge(`finished, ${sum("dead")} dead`, "dead");
      if (sum("cancelled")) return badge(`finished, ${sum("cancelled")} cancelled`, "cancelled");
      return badge("finished", "succeeded");
    }
    return badge(b.sealed ? "running" : "open", "running");
  }

  // The queue's limit keys: each key's running jobs against its limit (SPEC K7), and
  // its rate with the time it allows the next start when not now (SPEC K14).
  function keyLine(k) {
    const defaultRate = k.default_rate ?? null;
    if (k.default === null && defaultRate === null && !k.keys.length) return null;
    const shown = k.keys.slice(0, 20).map((u) =>
      h("span", { class: (u.limit !== null && u.running >= u.limit) || u.rate_next ? "key full" : "key", "data-key": u.key },
        `${u.key} ${u.running} / ${u.limit ?? "∞"}`,
        u.rate ? ` · at most ${u.rate}` : "",
        u.rate_next ? ` (next start ${new Date(u.rate_next).toLocaleTimeString()})` : ""));
    return h("p", { id: "keys" }, "limit keys: ",
      shown.flatMap((e, i) => (i ? [", ", e] : [e])),
      k.keys.length > 20 ? ` and ${k.keys.length - 20} more` : null,
      k.default !== null ? ` · every other key: at most ${k.default}` : null,
      defaultRate !== null ? h("span", { id: "key-rate" }, ` · every key without its own rate: at most ${defaultRate}`) : null);
  }

  async function queueHeader() {
    const [s, k] = await Promise.all([api(`/queues/${q(queue)}`), api(`/queues/${q(queue)}/keys`)]);
    if (!s.counted) return [h("p", { id: "summary" }, countNote(s)), keyLine(k)];
    return [h("p", { id: "summary" },
      STATES.filter((st) => s.counts[st]).map((st) => [badge(`${st} ${s.counts[st]}`, st), " "]),
      s.paused ? badge("paused") : null, " ", unserved(s), " ", `running ${s.running} / ${s.max_running ?? "∞"}`,
      // Leased jobs waiting in a worker's buffer are counted running by the backend.
      s.held ? h("span", { class: "muted held", title: "claimed ahead, waiting in a worker's buffer for a free slot: leased, not started (from the workers' beats)" }, ` (${s.held} of them claimed ahead, not started)`) : null,
      ` · ${s.workers} worker${s.workers === 1 ? "" : "s"}`,
      ` · oldest ready ${waited(s.oldest_ready_seconds)}`,
      s.rate ? h("span", { id: "queue-rate" }, ` · rate at most ${s.rate}`, s.rate_next ? ` (next start ${new Date(s.rate_next).toLocaleTimeString()})` : "") : null,
      " ", countNote(s)), keyLine(k)];
  }

  async function drawBatches() {
    const [head, list] = await Promise.all([queueHeader(), api(`/queues/${q(queue)}/batches?limit=${q(limit)}`)]);
    const rows = list.items.map((b) =>
      h("tr", { "data-batch": b.batch.id },
        h("td", {}, link(`${qpath(queue)}/batches/${b.batch.id}`, `#${b.batch.id}`), b.name ? [" ", h("span", { class: "batch-name" }, b.name)] : null),
        h("td", {}, batchState(b), " ", b.on_failure, b.sealed ? "" : " · unsealed", h("br"), batchTimes(b)),
        h("td", {}, b.stages.length ? b.stages.map(stageBar) : h("span", { class: "muted" }, "no jobs")),
        readOnly ? null : h("td", {}, batchDone(b) ? null : button("cancel batch", `/queues/${q(queue)}/batches/${b.batch.id}/cancel`, {}, { danger: true, name: "cancel-batch", confirm: `Cancel every unfinished job of batch ${b.batch.id}?` }))));
    return [head,
      list.items.length ? h("table", { id: "batches" }, h("thead", {}, h("tr", {}, h("th", {}, "batch"), h("th", {}, "state"), h("th", {}, "stages"), readOnly ? null : h("th", {}, ""))), h("tbody", {}, rows)) : h("p", { class: "muted" }, "No batches."),
      moreLink(list)];
  }

  // SVG elements, built like h(): text only through textContent.
  function svg(tag, attrs, ...children) {
    const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    for (const c of children.flat(Infinity)) {
      if (c === null || c === undefined) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  // The batch's attempts as bars on one row per worker, from first start to now: the
  // picture `relayq run` prints, for the page of jobs the API gave.
  function timeline(list) {
    const now = Date.now();
    const bars = list.items.flatMap((j) => j.attempt_log.map((a) => ({
      job: j.id, stage: j.stage, attempt: a.attempt, worker: a.worker, outcome: a.outcome,
      start: Date.parse(a.started_at), end: a.ended_at ? Date.parse(a.ended_at) : now,
      held: a.claimed_at ? Date.parse(a.started_at) - Date.parse(a.claimed_at) : 0,
    })));
    if (!bars.length) return h("p", { class: "muted", id: "timeline-empty" }, "No attempt has started yet.");
    // A worker runs several jobs at once (its slots): each attempt takes the first of
    // its worker's lanes free at its start, so overlapping attempts sit one above another.
    const workers = [...new Set(bars.map((b) => b.worker))].sort();
    const lanes = new Map(workers.map((w) => [w, []]));
    for (const b of [...bars].sort((p, n) => p.start - n.start)) {
      const ends = lanes.get(b.worker);
      b.lane = ends.findIndex((end) => end <= b.start);
      if (b.lane < 0) b.lane = ends.length;
      ends[b.lane] = b.end;
    }
    const first = new Map();
    let rows = 0;
    for (const w of workers) { first.set(w, rows); rows += lanes.get(w).length; }
    const t0 = Math.min(...bars.map((b) => b.start));
    const t1 = Math.max(t0 + 1, ...bars.map((b) => b.end));
    const label = 170, width = 760, row = 14, gap = 6;
    const x = (t) => label + ((t - t0) / (t1 - t0)) * width;
    const y = (w, lane) => (first.get(w) + lane) * row + workers.indexOf(w) * gap + 4;
    const height = rows * row + workers.length * gap;
    return h("div", { class: "timeline-wrap" },
      svg("svg", { id: "timeline", viewBox: `0 0 ${label + width + 10} ${height + 24}`, role: "img", "aria-label": "attempts by worker over time" },
        workers.map((w) => svg("text", { class: "worker", x: 0, y: y(w, 0) + 10 }, w.length > 26 ? `${w.slice(0, 25)}…` : w)),
        // Each bar links to its job's page.
        bars.map((b) => svg("a", { href: `${qpath(queue)}/jobs/${b.job}` }, svg("rect", { class: `att ${b.outcome}`, x: x(b.start).toFixed(1), y: y(b.worker, b.lane), width: Math.max(1.5, x(b.end) - x(b.start)).toFixed(1), height: row - 3, "data-job": b.job, "data-worker": b.worker },
          svg("title", {}, `job #${b.job}, stage ${b.stage}, attempt ${b.attempt} on ${b.worker}: ${b.outcome}, ${((b.end - b.start) / 1000).toFixed(2)} s${b.held >= 10 ? ` (claimed ${(b.held / 1000).toFixed(2)} s before, held in the worker)` : ""}`)))),
        svg("text", { class: "axis", x: label, y: height + 18 }, new Date(t0).toLocaleTimeString()),
        svg("text", { class: "axis end", x: label + width, y: height + 18 }, `+${((t1 - t0) / 1000).toFixed(1)} s`)),
      h("p", { class: "muted legend" }, `${bars.length} attempts of ${list.items.length} jobs on ${workers.length} worker${workers.length === 1 ? "" : "s"}`,
        ...["succeeded", "running", "failed", "expired", "released", "cancelled"].map((o) => [" ", badge(o)])));
  }

  // The jobs of the page that run after others (SPEC D) as a graph: a column per depth
  // (the longest chain of parents on the page before it), an arrow from each parent to
  // its child, each node a link to its job, coloured by state. Parents off the page are
  // named in the node's title.
  function dependencies(list) {
    const jobs = list.items;
    if (!jobs.some((j) => j.after.length)) return null;
    const byId = new Map(jobs.map((j) => [j.id, j]));
    const depth = new Map();
    const depthOf = (j, seen = new Set()) => {
      if (depth.has(j.id)) return depth.get(j.id);
      if (seen.has(j.id)) return 0;
      seen.add(j.id);
      const d = Math.max(0, ...j.after.filter((p) => byId.has(p)).map((p) => depthOf(byId.get(p), seen) + 1));
      depth.set(j.id, d);
      return d;
    };
    const columns = [];
    for (const j of jobs) (columns[depthOf(j)] ||= []).push(j);
    const w = 150, gapX = 40, rowH = 22, gapY = 6;
    const at = new Map();
    columns.forEach((col, c) => col.forEach((j, r) => at.set(j.id, { x: c * (w + gapX), y: r * (rowH + gapY) })));
    const width = columns.length * (w + gapX);
    const height = Math.max(...columns.map((col) => col.length)) * (rowH + gapY);
    const edges = jobs.flatMap((j) => j.after.filter((p) => at.has(p)).map((p) => [at.get(p), at.get(j.id)]));
    return h("div", { class: "graph-wrap" },
      // Drawn at its own size: scaled to the page's width, a small graph's names grew
      // past their boxes.
      svg("svg", { id: "graph", width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": "which jobs run after which" },
        edges.map(([a, b]) => svg("line", { class: "edge", x1: a.x + w, y1: a.y + rowH / 2, x2: b.x, y2: b.y + rowH / 2 })),
        jobs.map((j) => {
          const { x, y } = at.get(j.id);
          const off = j.after.filter((p) => !byId.has(p));
          const name = j.name.length > 20 ? `${j.name.slice(0, 19)}…` : j.name;
          return svg("a", { href: `${qpath(queue)}/jobs/${j.id}` },
            svg("rect", { class: `node ${j.state}`, x, y, width: w, height: rowH, rx: 3, "data-job": j.id }),
            svg("text", { class: "node-name", x: x + 6, y: y + 15 }, `#${j.id} ${name}`),
            svg("title", {}, `job #${j.id} ${j.name}: ${j.state}${j.after.length ? `, runs after ${j.after.map((p) => `#${p}`).join(", ")}` : ""}${off.length ? ` (${off.length} not on this page)` : ""}`));
        })));
  }

  async function drawBatch() {
    const after = params.get("after");
    const [b, jobs] = await Promise.all([
      api(`/queues/${q(queue)}/batches/${q(id)}`),
      api(`/queues/${q(queue)}/batches/${q(id)}/jobs?limit=${q(params.get("limit") || "100")}${after ? `&after=${q(after)}` : ""}`),
    ]);
    const next = new URLSearchParams(location.search);
    if (jobs.next !== null) next.set("after", String(jobs.next));
    const first = new URLSearchParams(location.search);
    first.delete("after");
    return [
      b.name ? h("h2", { class: "batch-name" }, b.name) : null,
      h("p", {}, batchState(b), " on failure: ", b.on_failure, b.sealed ? " · sealed" : " · unsealed", b.released_stage === null ? "" : ` · released up to stage ${b.released_stage}`, " · ", batchTimes(b)),
      h("div", { id: "stages" }, b.stages.map(stageBar)),
      h("p", {}, link(`${qpath(queue)}/jobs?batch=${q(id)}`, "the batch's jobs", "batch-jobs"), " · ", link(`${qpath(queue)}/jobs?batch=${q(id)}&state=dead`, "its dead jobs")),
      jobs.items.some((j) => j.after.length) ? h("h2", {}, "Which jobs run after which") : null,
      dependencies(jobs),
      h("h2", {}, "Attempts by worker"),
      timeline(jobs),
      jobs.more || after ? h("p", { class: "more" }, after ? [link(`?${first}`, "first jobs"), " · "] : null, jobs.more ? link(`?${next}`, "next jobs") : null) : null,
      readOnly || batchDone(b) ? null : h("p", {}, button("cancel batch", `/queues/${q(queue)}/batches/${q(id)}/cancel`, {}, { danger: true, name: "cancel-batch", confirm: `Cancel every unfinished job of batch ${id}?` })),
    ];
  }

  // A running attempt's progress: a bar and its message; an earlier attempt's report
  // says nothing of this one.
  const progressOf = (p, attempt) => !p || p.attempt !== attempt ? h("span", { class: "muted" }, "—")
    : h("span", { class: "progress" }, h("progress", { max: "100", value: String(p.percent), "aria-label": `${p.percent}%` }), ` ${p.percent}%`, p.message ? ` ${p.message}` : "");

  async function drawRunning() {
    const [head, list] = await Promise.all([queueHeader(), api(`/queues/${q(queue)}/running?limit=${q(limit)}`)]);
    const rows = list.items.map((r) =>
      h("tr", { "data-job": r.id },
        h("td", {}, link(`${qpath(queue)}/jobs/${r.id}`, `#${r.id}`)),
        h("td", { class: "name" }, r.name ?? ""), h("td", {}, batchCell(r)),
        h("td", {}, r.worker), num(r.attempt), h("td", {}, when(r.started_at)), h("td", {}, when(r.lease_expires_at)),
        h("td", {}, progressOf(r.progress, r.attempt)),
        readOnly ? null : h("td", {}, button("cancel", `/queues/${q(queue)}/jobs/${r.id}/cancel`, {}, { danger: true, name: "cancel-job", confirm: `Cancel job ${r.id}?` }))));
    return [head,
      list.items.length ? h("table", { id: "running" }, h("thead", {}, h("tr", {}, h("th", {}, "job"), h("th", {}, "name"), h("th", {}, "batch · stage"), h("th", {}, "worker"), h("th", {}, "attempt"), h("th", {}, "since"), h("th", {}, "lease expires"), h("th", {}, "progress"), readOnly ? null : h("th", {}, ""))), h("tbody", {}, rows)) : h("p", { class: "muted" }, "Nothing running."),
      moreLink(list)];
  }

  const batchCell = (j) => j.batch === null || j.batch === undefined ? h("span", { class: "muted" }, "—")
    : [link(`${qpath(queue)}/batches/${j.batch}`, `#${j.batch}`), ` · ${j.stage}`];

  // The jobs page: any job found by filter, newest first, a page at a time, with bulk
  // actions on the selected jobs or on every job that matches.
  const FILTERS = ["state", "batch", "stage", "group", "text"];
  // Ids ticked on this page, and what is typed in the filter form before it is sent:
  // both kept across redraws.
  const selected = new Set();
  const draft = Object.fromEntries(FILTERS.map((k) => [k, params.get(k) || ""]));

  async function drawJobs() {
    const query = new URLSearchParams();
    for (const k of [...FILTERS, "before", "limit"]) if (params.get(k)) query.set(k, params.get(k));
    const [head, list] = await Promise.all([queueHeader(), api(`/queues/${q(queue)}/jobs?${query}`)]);
    const shown = new Set(list.items.map((j) => String(j.id)));
    for (const sel of [...selected]) if (!shown.has(sel)) selected.delete(sel);
    const field = (k, attrs) => h("input", { name: k, placeholder: k, value: draft[k], "aria-label": k, oninput: (ev) => { draft[k] = ev.target.value; }, ...attrs });
    const filterForm = h("form", { id: "job-filter", class: "toolbar", onsubmit: (ev) => {
      ev.preventDefault();
      const next = new URLSearchParams();
      for (const k of FILTERS) {
        const v = ev.target.elements[k].value.trim();
        if (v) next.set(k, v);
      }
      selected.clear();
      location.search = next.toString();
    } },
      h("select", { name: "state", "aria-label": "state", onchange: (ev) => { draft.state = ev.target.value; } }, h("option", { value: "" }, "any state"),
        STATES.map((st) => h("option", { value: st, selected: draft.state === st }, st))), " ",
      field("batch"), " ", field("stage"), " ", field("group"), " ",
      field("text", { class: "wide", placeholder: "name or error text" }), " ",
      h("button", { type: "submit", "data-action": "filter" }, "filter"), " ",
      link(`${qpath(queue)}/jobs`, "clear"));
    const filterBody = Object.fromEntries(FILTERS.filter((k) => params.get(k)).map((k) => [k, params.get(k)]));
    const bulk = async (action, ids) => {
      const what = ids ? `${ids.length} selected job${ids.length === 1 ? "" : "s"}` : "every job that matches this filter";
      const verb = action === "run_now" ? "Run now" : `${action[0].toUpperCase()}${action.slice(1)}`;
      if (!window.confirm(`${verb} ${what}?`)) return;
      selected.clear();
      if (ids) return act(`/queues/${q(queue)}/jobs/bulk`, { action, ids });
      // Every match: 10,000 a call, each call going on below the last.
      let before = null, changed = 0, unchanged = 0;
      try {
        for (let call = 0; call < 1000; call++) {
          const filter = before === null ? filterBody : { ...filterBody, before: String(before) };
          const out = await post(`/queues/${q(queue)}/jobs/bulk`, { action, filter });
          changed += out.cancelled ?? out.retried ?? out.deleted ?? out.due_now ?? 0;
          unchanged += out.unchanged;
          if (!out.more) break;
          before = out.next;
        }
        const past = { cancel: "cancelled", retry: "retried", delete: "deleted", run_now: "due now" }[action];
        showError(unchanged ? `${changed} ${past}; ${unchanged} left as they were` : null);
      } catch (e) {
        showError(`action failed: ${e.message}`);
      }
      refresh();
    };
    const picked = () => [...selected].map(Number);
    const tools = readOnly ? null : h("p", { class: "toolbar", id: "bulk" },
      h("button", { "data-action": "cancel-selected", class: "danger", disabled: !selected.size, onclick: () => bulk("cancel", picked()) }, `cancel selected (${selected.size})`),
      h("button", { "data-action": "retry-selected", disabled: !selected.size, onclick: () => bulk("retry", picked()) }, `retry selected (${selected.size})`),
      h("button", { "data-action": "run-now-selected", disabled: !selected.size, onclick: () => bulk("run_now", picked()) }, `run selected now (${selected.size})`),
      h("button", { "data-action": "delete-selected", class: "danger", disabled: !selected.size, onclick: () => bulk("delete", picked()) }, `delete selected (${selected.size})`),
      " ", h("span", { class: "muted" }, "or every match:"), " ",
      h("button", { "data-action": "cancel-matching", class: "danger", onclick: () => bulk("cancel") }, "cancel all matching"),
      h("button", { "data-action": "retry-matching", onclick: () => bulk("retry") }, "retry all matching"),
      h("button", { "data-action": "run-now-matching", onclick: () => bulk("run_now") }, "run all matching now"),
      h("button", { "data-action": "delete-matching", class: "danger", onclick: () => bulk("delete") }, "delete all matching"));
    const tick = (j) => h("input", { type: "checkbox", class: "pick", "aria-label": `select job ${j.id}`, checked: selected.has(String(j.id)), onchange: (ev) => {
      if (ev.target.checked) selected.add(String(j.id)); else selected.delete(String(j.id));
      refresh();
    } });
    const tickAll = h("input", { type: "checkbox", "aria-label": "select every job of this page", checked: list.items.length > 0 && list.items.every((j) => selected.has(String(j.id))), onchange: (ev) => {
      for (const j of list.items) if (ev.target.checked) selected.add(String(j.id)); else selected.delete(String(j.id));
      refresh();
    } });
    const rows = list.items.map((j) =>
      h("tr", { "data-job": j.id },
        readOnly ? null : h("td", {}, tick(j)),
        h("td", {}, link(`${qpath(queue)}/jobs/${j.id}`, `#${j.id}`)),
        h("td", {}, badge(j.state)),
        h("td", { class: "name" }, j.name),
        h("td", {}, batchCell(j)),
        h("td", {}, j.group ?? h("span", { class: "muted" }, "—")),
        h("td", { class: "num" }, `${j.attempts}/${j.max_attempts}`),
        h("td", {}, when(j.created_at)),
        h("td", {}, j.finished_at ? when(j.finished_at) : j.worker ? [j.worker, " ", progressOf(j.progress, j.attempts)] : when(j.run_at)),
        h("td", {}, j.error ? h("span", { class: "error-line" }, j.error) : "")));
    const next = new URLSearchParams(location.search);
    if (list.next !== null) next.set("before", String(list.next));
    const newest = new URLSearchParams(location.search);
    newest.delete("before");
    // A short page with more below: the backend stopped after looking at its share of
    // jobs (SPEC M7), not at the end.
    const short = list.next !== null && list.items.length < list.limit;
    return [head, filterForm, tools,
      list.items.length ? h("table", { id: "jobs" },
        h("thead", {}, h("tr", {}, readOnly ? null : h("th", {}, tickAll), ["job", "state", "name", "batch · stage", "group", "attempts", "created", "finished · running on · runs"].map((t) => h("th", {}, t)), h("th", {}, "last error"))),
        h("tbody", {}, rows)) : h("p", { class: "muted", id: "jobs-empty" }, list.next === null ? "No job matches." : "No match among the jobs looked at so far."),
      h("p", { class: "more" },
        params.get("before") ? [link(`?${newest}`, "newest"), " · "] : null,
        list.next !== null ? link(`?${next}`, short ? `look further (below #${list.next})` : "older jobs", "older") : h("span", { class: "muted" }, "end of the list"))];
  }

  const lastOutput = (j) => [...j.attempt_log].reverse().find((a) => a.output)?.output;

  async function drawDead() {
    const [head, list] = await Promise.all([queueHeader(), api(`/queues/${q(queue)}/dead?limit=${q(limit)}`)]);
    const rows = list.items.map((j) =>
      h("tr", { "data-job": j.id },
        h("td", {}, link(`${qpath(queue)}/jobs/${j.id}`, `#${j.id}`)),
        h("td", {}, h("pre", { class: "payload" }, j.payload)),
        h("td", {}, h("pre", { class: "error-text" }, j.last_error ?? "")),
        h("td", {}, lastOutput(j) ? h("pre", { class: "output" }, lastOutput(j)) : h("span", { class: "muted" }, "—")),
        h("td", { class: "num" }, `${j.attempts}/${j.max_attempts}`),
        h("td", {}, when(j.finished_at)),
        readOnly ? null : h("td", {}, j.batch === null ? button("retry", `/queues/${q(queue)}/jobs/${j.id}/retry`, {}, { name: "retry" }) : h("span", { class: "muted", title: "dead jobs of a batch stay dead: rerun the batch" }, "in batch"))));
    return [head,
      readOnly || !list.items.length ? null : h("p", { class: "toolbar" }, button("retry all", `/queues/${q(queue)}/dead/retry`, {}, { name: "retry-all", confirm: `Put every dead job of ${queue} back to ready?` })),
      list.items.length ? h("table", { id: "dead" }, h("thead", {}, h("tr", {}, h("th", {}, "job"), h("th", {}, "payload"), h("th", {}, "error"), h("th", {}, "output"), h("th", {}, "attempts"), h("th", {}, "died"), readOnly ? null : h("th", {}, ""))), h("tbody", {}, rows)) : h("p", { class: "muted" }, "No dead jobs."),
      moreLink(list)];
  }

  async function drawSchedules() {
    const [head, list] = await Promise.all([queueHeader(), api(`/queues/${q(queue)}/schedules`)]);
    const path = (s, what) => `/queues/${q(queue)}/schedules/${q(s.name)}/${what}`;
    const made = (s) => s.last_batch !== null ? link(`${qpath(queue)}/batches/${s.last_batch}`, `batch ${s.last_batch}`)
      : s.last_job !== null ? link(`${qpath(queue)}/jobs/${s.last_job}`, `#${s.last_job}`) : h("span", { class: "muted" }, "—");
    const rows = list.map((s) =>
      h("tr", { "data-schedule": s.name },
        h("td", {}, s.name),
        h("td", {}, h("code", {}, s.cron ?? "?"), " ", h("span", { class: "muted" }, s.time_zone ?? "")),
        h("td", {}, s.paused ? badge("paused") : badge("running")),
        h("td", {}, s.makes === null ? "?" : h("pre", { class: "payload" }, s.makes)),
        h("td", {}, s.missed ?? "?"),
        h("td", {}, s.last_slot ? when(s.last_slot) : h("span", { class: "muted" }, "—")),
        h("td", {}, made(s)),
        h("td", {}, s.next_slot ? when(s.next_slot) : h("span", { class: "muted" }, "—")),
        readOnly ? null : h("td", {},
          s.paused ? button("resume", path(s, "resume"), {}, { name: "resume" }) : button("pause", path(s, "pause"), {}, { name: "pause" }),
          " ", button("run now", path(s, "run-now"), {}, { name: "run-now", confirm: `Enqueue one run of ${s.name} now?` }))));
    return [head,
      list.length ? h("table", { id: "schedules" }, h("thead", {}, h("tr", {}, h("th", {}, "name"), h("th", {}, "cron"), h("th", {}, "state"), h("th", {}, "each slot"), h("th", {}, "missed slots"), h("th", {}, "last slot"), h("th", {}, "made"), h("th", {}, "next slot"), readOnly ? null : h("th", {}, ""))), h("tbody", {}, rows)) : h("p", { class: "muted" }, "No schedules: add one with relayq schedule add.")];
  }

  async function drawJob() {
    const [j, why] = await Promise.all([api(`/queues/${q(queue)}/jobs/${q(id)}`), api(`/queues/${q(queue)}/jobs/${q(id)}/why`)]);
    const field = (k, v) => [h("dt", {}, k), h("dd", {}, v ?? h("span", { class: "muted" }, "—"))];
    const unfinished = ["scheduled", "ready", "blocked", "running", "retrying"].includes(j.state);
    return [
      h("dl", { id: "job" },
        field("state", badge(j.state)),
        field("why", h("ul", { id: "why" }, why.why.map((line) => h("li", {}, line)))),
        field("payload", h("pre", { class: "payload" }, j.payload + (j.payload_utf8 ? "" : "\n(not UTF-8: invalid bytes shown as �)"))),
        field("attempts", `${j.attempts} of ${j.max_attempts}`),
        field("progress", j.progress ? [progressOf(j.progress, j.progress.attempt), ` (attempt ${j.progress.attempt})`] : null),
        field("result", j.result === null ? null : h("pre", { class: "output", id: "result" }, j.result)),
        field("priority", String(j.priority)),
        field("group", j.group),
        field("batch", j.batch === null ? null : link(`${qpath(queue)}/batches/${j.batch}`, `#${j.batch} stage ${j.stage}`)),
        field("runs after", j.after.length ? j.after.map((p, i) => [i ? ", " : "", link(`${qpath(queue)}/jobs/${p}`, `#${p}`)]) : null),
        field("dedupe key", j.dedupe_key),
        field("enqueued by", j.enqueued_by),
        field("created", when(j.created_at)),
        field("run at", when(j.run_at)),
        field("finished", j.finished_at ? when(j.finished_at) : null),
        field("last error", j.last_error === null ? null : h("pre", { class: "error-text" }, j.last_error))),
      readOnly ? null : h("p", { class: "toolbar" },
        unfinished ? button("cancel job", `/queues/${q(queue)}/jobs/${j.id}/cancel`, {}, { danger: true, name: "cancel-job", confirm: `Cancel job ${j.id}?` }) : null,
        j.state === "dead" && j.batch === null ? button("retry", `/queues/${q(queue)}/jobs/${j.id}/retry`, {}, { name: "retry" }) : null,
        // Waits only for its time (scheduled, or a retry's backoff): it may run now.
        j.state === "scheduled" || (j.state === "retrying" && Date.parse(j.run_at) > Date.now())
          ? button("run now", `/queues/${q(queue)}/jobs/bulk`, { action: "run_now", ids: [j.id] }, { name: "run-now" }) : null,
        // A finished job can go before its retention ends; its page then says it is gone.
        unfinished ? null : button("delete", `/queues/${q(queue)}/jobs/bulk`, { action: "delete", ids: [j.id] }, { danger: true, name: "delete-job", confirm: `Delete job ${j.id} and its attempts?` })),
      h("h2", {}, "Attempts"),
      j.attempt_log.length ? h("table", { id: "attempts" },
        h("thead", {}, h("tr", {}, ["#", "worker", "started", "ended", "outcome", "error", "output"].map((t) => h("th", {}, t)))),
        h("tbody", {}, j.attempt_log.map((a) => h("tr", {},
          num(a.attempt), h("td", {}, a.worker), h("td", {}, when(a.started_at)), h("td", {}, when(a.ended_at)),
          h("td", {}, badge(a.outcome)), h("td", {}, a.error ? h("pre", {}, a.error) : ""), h("td", {}, a.output ? h("pre", {}, a.output) : ""))))) : h("p", { class: "muted" }, "Not started yet."),
    ];
  }

  // One line chart: `points` are [time ms, value]; the y axis starts at zero.
  function chart(id, title, unit, points) {
    const w = 720, hgt = 120, left = 50, pad = 6;
    if (points.filter((p) => p[1] !== null).length < 2) return h("div", { class: "chart", id }, h("h2", {}, title), h("p", { class: "muted" }, "collecting: a point about every 5 s"));
    const t0 = points[0][0], t1 = Math.max(t0 + 1, points[points.length - 1][0]);
    const top = Math.max(...points.filter((p) => p[1] !== null).map((p) => p[1]), 1e-9);
    const x = (t) => left + ((t - t0) / (t1 - t0)) * (w - left - pad);
    const y = (v) => hgt - pad - (v / top) * (hgt - 2 * pad);
    // A null value is a gap: the line stops there and starts again after it.
    let move = true;
    const path = points.map((p) => {
      if (p[1] === null) { move = true; return ""; }
      const step = `${move ? "M" : "L"}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`;
      move = false;
      return step;
    }).join(" ");
    const last = points.filter((p) => p[1] !== null).pop()[1];
    return h("div", { class: "chart", id },
      h("h2", {}, title, " ", h("span", { class: "muted now" }, `now ${last.toFixed(last < 10 ? 2 : 0)} ${unit}`)),
      svg("svg", { viewBox: `0 0 ${w} ${hgt + 16}`, role: "img", "aria-label": title },
        svg("path", { class: "line", d: path }),
        svg("text", { class: "axis", x: 0, y: pad + 8 }, `${top.toFixed(top < 10 ? 2 : 0)}`),
        svg("text", { class: "axis", x: 0, y: hgt - pad }, "0"),
        svg("text", { class: "axis", x: left, y: hgt + 14 }, new Date(t0).toLocaleTimeString()),
        svg("text", { class: "axis end", x: w - pad, y: hgt + 14 }, new Date(t1).toLocaleTimeString())));
  }

  // Throughput, failures and wait over the last hour, from the counts this dashboard
  // sampled. A step in which a count went down (pruning, a retry) is a gap: its rate
  // is unknown, not zero.
  async function drawCharts() {
    const [head, hist] = await Promise.all([queueHeader(), api(`/queues/${q(queue)}/history`)]);
    const s = hist.samples.map((x) => ({ ...x, t: Date.parse(x.at) }));
    const rate = (k) => s.slice(1).map((x, i) => [x.t, x[k] < s[i][k] ? null : (x[k] - s[i][k]) / Math.max(1e-3, (x.t - s[i].t) / 1000)]);
    return [head,
      h("p", { class: "muted", id: "charts-note" }, s.length
        ? `${s.length} sample${s.length === 1 ? "" : "s"} since ${new Date(s[0].t).toLocaleTimeString()}, taken while this dashboard counts the queue (every ${hist.every_seconds} s at most, the last hour).`
        : "No sample yet."),
      chart("chart-done", "jobs succeeded per second", "/s", rate("succeeded")),
      chart("chart-dead", "jobs died per second", "/s", rate("dead")),
      chart("chart-wait", "longest wait of a ready job", "s", s.map((x) => [x.t, x.oldest_ready_seconds ?? 0])),
      chart("chart-ready", "jobs waiting (ready and retrying)", "jobs", s.map((x) => [x.t, x.ready]))];
  }

  const pages = { queues: drawQueues, charts: drawCharts, workers: drawWorkers, batches: drawBatches, jobs: drawJobs, batch: drawBatch, running: drawRunning, dead: drawDead, schedules: drawSchedules, job: drawJob };

  // How often the page asks again (ms; 0: paused), kept across pages in this browser.
  const RATE_KEY = "relayq-refresh-ms";
  let every = 1000;
  try {
    const kept = localStorage.getItem(RATE_KEY);
    if (kept !== null && !Number.isNaN(Number(kept))) every = Number(kept);
  } catch (_) {}
  const rate = $("#rate");
  if (rate) {
    rate.value = String(every);
    if (rate.value === "") rate.value = String((every = 1000));
    rate.onchange = () => {
      every = Number(rate.value);
      try { localStorage.setItem(RATE_KEY, String(every)); } catch (_) {}
      refresh();
    };
  }

  let timer = null;
  async function refresh() {
    clearTimeout(timer);
    // Redrawing would drop what the user is typing, or the text they selected: wait
    // until the field loses focus or the selection is cleared.
    const active = document.activeElement;
    const typing = active && (active.tagName === "INPUT" && active.type !== "checkbox"
      || active.tagName === "SELECT" && $("#content").contains(active));
    const sel = window.getSelection();
    const selecting = sel && !sel.isCollapsed && $("#content").contains(sel.anchorNode);
    if (!typing && !selecting) {
      try {
        const content = await pages[page]();
        // Scrolled boxes (output, the timeline) keep their place across the redraw.
        const scrolled = () => [...$("#content").querySelectorAll("pre, .timeline-wrap")];
        const tops = scrolled().map((e) => [e.scrollTop, e.scrollLeft]);
        $("#content").replaceChildren(...[content].flat(2).filter(Boolean));
        scrolled().forEach((e, i) => {
          if (tops[i]) [e.scrollTop, e.scrollLeft] = tops[i];
        });
        $("#status").textContent = `updated ${new Date().toLocaleTimeString()}`;
        $("#status").dataset.updated = String(Date.now());
        if ($("#error").textContent.startsWith("refresh failed")) showError(null);
      } catch (e) {
        showError(`refresh failed: ${e.message}`);
      }
    }
    if (every > 0) timer = setTimeout(refresh, every);
    else $("#status").textContent = "paused";
  }
  nav();
  refresh();
})();
