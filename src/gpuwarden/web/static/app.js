// gpuwarden web: draws /api/v1/state, live through server-sent events (a short
// poll where EventSource is missing). Every string from the server is set with
// textContent or as an SVG/DOM attribute, never parsed as markup: process names,
// drain reasons and job names are written by other users.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
let last = null; // the last document, for the "updated … ago" line

// A preemptible job says so (and whether it is being preempted); a job queued again
// says which run it is, as `gpuwarden queue` does.
function runsNote(j) {
  const bits = [];
  if (j.preemptible) bits.push(j.reason === "preempted" ? "preempted" : "preemptible");
  if (j.restarts) bits.push(`run ${j.restarts + 1}`);
  if (j.preemptions) bits.push(`preempted ${j.preemptions}x`);
  return bits.length ? ` (${bits.join(", ")})` : "";
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== null && v !== undefined) node.setAttribute(k, String(v));
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  return node;
}

function size(bytes) {
  if (bytes === null || bytes === undefined) return "n/a";
  const gib = bytes / 2 ** 30;
  if (gib >= 1) return gib.toFixed(1) + " GiB";
  return (bytes / 2 ** 20).toFixed(0) + " MiB";
}

function span(seconds) {
  if (seconds === null || seconds === undefined) return "n/a";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
  const h = Math.floor(s / 3600);
  if (h < 48) return h + "h" + String(Math.floor((s % 3600) / 60)).padStart(2, "0") + "m";
  return Math.floor(h / 24) + "d";
}

function clock(t) {
  if (t === null || t === undefined) return "n/a";
  return new Date(t * 1000).toLocaleTimeString();
}

function hue(name) {
  let h = 2166136261; // FNV-1a, then spread by the golden angle: neighbours differ
  for (const ch of String(name)) h = Math.imul(h ^ ch.codePointAt(0), 16777619) >>> 0;
  return Math.round((h % 1000) * 137.508) % 360;
}

function shortName(name) {
  if (!name) return "unknown";
  for (const prefix of ["NVIDIA GeForce ", "NVIDIA ", "Tesla "]) {
    if (name.startsWith(prefix)) return name.slice(prefix.length);
  }
  return name;
}

function userColor(name) {
  return name ? `hsl(${hue(name)} 60% 52%)` : "hsl(0 0% 55%)";
}

// The memory bar: one segment per process, coloured by its user, then memory no
// listed process accounts for, then free. Each segment's <title> is its tooltip.
function memoryBar(gpu) {
  const bar = svg("svg", { class: "bar", viewBox: "0 0 1000 14", preserveAspectRatio: "none",
    role: "img", "aria-label": "memory by user" });
  bar.append(svg("rect", { x: 0, y: 0, width: 1000, height: 14, class: "free" }));
  const total = gpu.memory_total || 0;
  if (!total) return bar;
  let x = 0;
  const add = (bytes, color, label, dashed) => {
    if (!bytes) return;
    const w = Math.max(1, (bytes / total) * 1000);
    const r = svg("rect", { x: x, y: 0, width: w, height: 14, fill: color });
    if (dashed) r.setAttribute("opacity", "0.45");
    const t = svg("title", {});
    t.textContent = label;
    r.append(t);
    bar.append(r);
    x += w;
  };
  for (const p of gpu.processes) {
    add(p.memory, userColor(p.user), `${p.user || "?"} (pid ${p.pid}${p.name ? ", " + p.name : ""}): ${size(p.memory)}`);
  }
  add(gpu.memory_other, "hsl(0 0% 60%)", `not in any listed process: ${size(gpu.memory_other)}`, true);
  // Shared leases declare a share: draw each declaration as a tick on the bar.
  let declared = 0;
  for (const l of gpu.leases) {
    if (l.mem === null) continue;
    declared += l.mem;
    const at = Math.min(1000, (declared / total) * 1000);
    const tick = svg("rect", { x: Math.max(0, at - 3), y: 0, width: 3, height: 14, class: "declared" });
    const t = svg("title", {});
    t.textContent = `${l.user} declared ${size(l.mem)}`;
    tick.append(t);
    bar.append(tick);
  }
  return bar;
}

// Sparkline of the last hour: utilization (filled) and temperature (line, 20-100 °C).
function sparkline(history) {
  const box = svg("svg", { class: "spark", viewBox: "0 0 100 28", preserveAspectRatio: "none",
    role: "img", "aria-label": "utilization and temperature, last hour" });
  let { utilization, temperature } = history;
  if (utilization.length === 0) return box;
  if (utilization.length === 1) { // one sample so far: a level line, not a ramp
    utilization = [utilization[0], utilization[0]];
    temperature = [temperature[0], temperature[0]];
  }
  const legend = svg("title", {});
  legend.textContent = "last hour: utilization (filled), temperature 20-100 °C (line)";
  box.append(legend);
  const n = utilization.length;
  const xAt = (i) => (i / (n - 1)) * 100;
  const util = utilization.map((u, i) => [xAt(i), 27 - ((u || 0) / 100) * 26]);
  const area = "0,27 " + util.map(([x, y]) => `${x.toFixed(2)},${y.toFixed(2)}`).join(" ") + " 100,27";
  box.append(svg("polygon", { points: area, fill: "hsl(210 70% 55% / .35)", stroke: "hsl(210 70% 45%)",
    "stroke-width": 0.6, "vector-effect": "non-scaling-stroke" }));
  const temps = [];
  temperature.forEach((c, i) => {
    if (c !== null) temps.push(`${xAt(i).toFixed(2)},${(27 - ((Math.min(100, Math.max(20, c)) - 20) / 80) * 26).toFixed(2)}`);
  });
  if (temps.length) {
    box.append(svg("polyline", { points: temps.join(" "), fill: "none", stroke: "hsl(15 85% 50%)",
      "stroke-width": 1.2, "vector-effect": "non-scaling-stroke" }));
  }
  return box;
}

function gpuCard(gpu) {
  const level = gpu.lost ? "fatal" : gpu.health.level;
  const classes = ["gpu", level];
  if (gpu.drain) classes.push("drained");
  const markText = gpu.lost ? "LOST" : level === "ok" ? "ok" : level === "fatal" ? "FATAL" : "warning";
  const card = el("article", { class: classes.join(" "), "data-uuid": gpu.uuid, "data-index": gpu.index,
    "data-memory-used": gpu.memory_used, "data-memory-total": gpu.memory_total, "data-health": level },
    el("div", { class: "top" },
      el("span", { class: "name", title: gpu.uuid }, `GPU ${gpu.index} · ${shortName(gpu.name)}${gpu.mig ? " [MIG]" : ""}`),
      el("span", { class: "mark " + level }, markText)));
  card.append(el("div", { class: "mem" }, `${size(gpu.memory_used)} / ${size(gpu.memory_total)}`));
  card.append(memoryBar(gpu));
  card.append(el("div", { class: "stats" },
    el("span", { class: "util", title: "utilization" }, gpu.utilization === null ? "n/a" : gpu.utilization + "%"),
    el("span", { class: "temp", title: "temperature" }, gpu.temperature === null ? "n/a" : gpu.temperature + "°C"),
    sparkline(gpu.history)));
  if (gpu.drain) {
    card.append(el("p", { class: "note drain" },
      `drained by ${gpu.drain.by}${gpu.drain.auto ? " (automatic)" : ""}: `,
      el("span", { class: "drain-reason" }, gpu.drain.reason)));
  }
  for (const f of gpu.health.findings) {
    card.append(el("p", { class: "note finding " + f.level.toLowerCase(), title: f.action }, f.reason));
  }
  if (gpu.error) card.append(el("p", { class: "note finding fatal" }, gpu.error));
  const items = [...gpu.leases.map(leaseItem), ...gpu.processes.filter((p) => p.slice === null).map(processItem)];
  if (items.length) card.append(el("ul", { class: "list" }, ...items));
  // A MIG slice is a GPU of its own to a job: its row says whose it is and what runs in it.
  for (const s of gpu.slices) {
    const inside = [...s.leases.map(leaseItem), ...gpu.processes.filter((p) => p.slice === s.index).map(processItem)];
    card.append(el("div", { class: "slice", "data-uuid": s.uuid, title: s.uuid },
      el("div", { class: "top" },
        el("span", { class: "name" }, `MIG ${gpu.index}:${s.index} · ${s.profile || "n/a"}`),
        el("span", { class: "mem" }, `${size(s.memory_used)} / ${size(s.memory_total)}`),
        el("span", { class: "lease-mark" }, s.leases.length ? s.leases.map((l) => l.user).join(", ") : "free")),
      inside.length ? el("ul", { class: "list" }, ...inside) : null));
  }
  return card;
}

function leaseItem(l) {
  const expiry = l.expires_in === null ? "until the job ends" : `ends in ${span(l.expires_in)}`;
  return el("li", { class: "lease", "data-job": l.job },
    `lease ${l.job || "?"} · ${l.user} · ${span(l.age)} · ${expiry}`,
    l.mem !== null ? ` · shares ${size(l.mem)}` : "",
    l.command ? el("div", { class: "muted" }, l.command) : null);
}

function processItem(p) {
  return el("li", { class: "process", "data-reserved": p.reserved },
    `${p.user || "?"} · pid ${p.pid}${p.name ? " · " + p.name : ""} · ${size(p.memory)}`,
    p.reserved ? null : el("span", { class: "unreserved", title: "on this GPU without a lease" }, " · no lease"),
    p.command ? el("div", { class: "muted" }, p.command) : null);
}

// The job's owner, and the account its GPU-hours are charged to where it names one.
function whose(j) {
  return j.account ? `${j.user} (${j.account})` : j.user;
}

function swatch(user) {
  const mark = el("span", { "aria-hidden": "true" }, "■ ");
  mark.style.color = userColor(user); // CSSOM, not a style attribute: the CSP forbids those
  return mark;
}

function rows(table, list, make, empty) {
  const body = table.tBodies[0];
  const cols = table.tHead.rows[0].cells.length;
  body.replaceChildren(...(list.length ? list.map(make) : [el("tr", {}, el("td", { class: "empty", colspan: cols }, empty))]));
}

function draw(doc) {
  last = doc;
  document.title = `${doc.hostname} · gpuwarden`;
  document.getElementById("host").textContent = doc.hostname;
  const bits = [`driver ${doc.driver_version || "n/a"}`, `CUDA ${doc.cuda_driver_version || "n/a"}`];
  if (doc.source !== "nvml") bits.push(doc.source);
  bits.push(doc.watch.running ? (doc.watch.listening ? "health watch on" : "health watch starting") : "health watch off");
  bits.push(doc.queue.service ? `queue service running${doc.queue.user ? " (seen as " + doc.queue.user + ")" : ""}`
    : doc.queue.state === "service not answering" ? "queue service not answering" : "no queue service");
  document.getElementById("machine").textContent = bits.join(" · ");
  const error = document.getElementById("error");
  error.hidden = !doc.error;
  error.textContent = doc.error || "";
  document.getElementById("gpus").replaceChildren(...doc.gpus.map(gpuCard));
  rows(document.getElementById("users"), doc.users, (u) => el("tr", { "data-user": u.user },
    el("td", {}, swatch(u.user), u.user),
    el("td", {}, counted(u.used_gpus)),
    el("td", {}, counted(u.leased_gpus)),
    el("td", {}, size(u.memory)),
    el("td", {}, u.processes),
    el("td", { class: u.unreserved ? "unreserved" : "" }, u.unreserved || "-"),
    el("td", {}, u.jobs_running || u.jobs_waiting ? `${u.jobs_running} / ${u.jobs_waiting}` : "-"),
    el("td", {}, u.usage === null ? "-" : (u.usage / 3600).toFixed(1) + " GPU-h"),
    el("td", {}, u.share === null ? "-" : u.share),
    el("td", {}, u.factor === null ? "-" : u.factor.toFixed(3))), "nobody on the GPUs");
  drawQueue(doc.queue, doc.now);
  rows(document.getElementById("waitline"), doc.waitline, (w, i) => el("tr", {},
    el("td", {}, i + 1), el("td", {}, w.user), el("td", {}, w.wants), el("td", {}, span(w.waited))),
    "nobody waiting");
  rows(document.getElementById("faults"), doc.faults, (f) => el("tr", { class: f.fatal ? "finding fatal" : "", "data-xid": f.xid },
    el("td", {}, clock(f.at)), el("td", {}, f.index === null ? f.uuid : f.index),
    el("td", {}, f.xid + (f.fatal ? " (fatal)" : "")), el("td", {}, f.description)), "no XID errors this boot");
  drawPeers(doc.peers || []);
  tick();
}

// Other hosts' pages (`web --peers`), as this server read them: a row per GPU, or one
// row saying why a host shows none.
function drawPeers(peers) {
  document.getElementById("peers-panel").hidden = !peers.length;
  const list = [];
  for (const p of peers) {
    const host = p.hostname || p.url;
    if (p.error || !p.gpus.length) list.push({ host, url: p.url, error: p.error || "no GPUs" });
    for (const g of p.gpus) list.push({ host, url: p.url, gpu: g });
  }
  rows(document.getElementById("peers"), list, (r) => r.gpu === undefined
    ? el("tr", { class: "finding", "data-peer": r.url }, el("td", {}, r.host), el("td", { colspan: 7 }, r.error))
    : el("tr", { "data-peer": r.url, "data-gpu": r.gpu.index },
      el("td", {}, r.host), el("td", {}, r.gpu.index === null ? "?" : r.gpu.index),
      el("td", {}, shortName(r.gpu.name || "n/a")),
      el("td", {}, r.gpu.utilization === null ? "n/a" : r.gpu.utilization + "%"),
      el("td", {}, `${size(r.gpu.memory_used)} / ${size(r.gpu.memory_total)}`),
      el("td", {}, r.gpu.temperature === null ? "n/a" : r.gpu.temperature + "°C"),
      el("td", {}, (r.gpu.health || "n/a") + (r.gpu.drained ? ", drained" : "")),
      el("td", {}, r.gpu.users.join(", ") || "-")), "no other hosts");
}

// A count first, then where: "2 (GPU 0, 1)", so an index is never read as a count.
function counted(indices) {
  return indices.length ? `${indices.length} (GPU ${indices.join(", ")})` : "-";
}

function gpusOf(job) {
  if (job.gpus.length) return counted(job.gpus);
  const n = job.count === null ? "?" : job.count;
  return `${n}${job.mem !== null ? " × " + size(job.mem) : ""}`;
}

function jobCell(job) {
  return el("td", {}, job.name || String(job.id), job.command ? el("div", { class: "muted" }, job.command) : null);
}

// The queue service's jobs; without a service, one line saying why there is none.
function drawQueue(queue, now) {
  const state = document.getElementById("queue-state");
  const bits = [];
  if (!queue.service) bits.push(queue.state);
  if (queue.error) bits.push(queue.error);
  if (queue.hidden) bits.push(`${queue.hidden} more jobs not listed`);
  state.textContent = bits.join(": ");
  state.classList.toggle("error", queue.state !== "running" && queue.error !== null);
  document.getElementById("queue-service").hidden = !queue.service;
  rows(document.getElementById("queue-running"), queue.running, (j) => el("tr", { "data-job": j.id, "data-state": j.state },
    jobCell(j), el("td", {}, swatch(j.user), whose(j)), el("td", {}, j.state.toLowerCase() + runsNote(j)),
    el("td", {}, gpusOf(j)), el("td", {}, span(j.waited)), el("td", {}, span(j.elapsed)),
    el("td", {}, j.time_limit === null ? "-" : span(j.time_limit))), "no job running");
  rows(document.getElementById("queue-waiting"), queue.waiting, (j) => el("tr", { "data-job": j.id, "data-reason": j.reason },
    jobCell(j), el("td", {}, swatch(j.user), whose(j)), el("td", {}, gpusOf(j)),
    el("td", { class: "reason" }, (j.reason || "-") + runsNote(j)),
    el("td", {}, j.priority === null ? "-" : Math.round(j.priority)),
    el("td", {}, span(j.waited)),
    el("td", {}, j.estimated_start === null ? "-" : j.estimated_start <= now ? "now" : `in ${span(j.estimated_start - now)}`)),
    "no job waiting");
  rows(document.getElementById("queue-bookings"), queue.bookings || [], (b) => el("tr", { "data-booking": b.id },
    el("td", {}, b.id), el("td", {}, b.whom), el("td", {}, b.count),
    el("td", {}, b.start <= now ? "now" : `in ${span(b.start - now)}`), el("td", {}, `in ${span(b.end - now)}`),
    el("td", { class: "timeline" }, timeline(b, now)), el("td", {}, b.reason)),
    "no GPUs booked");
  const used = queue.usage || { month: "", users: [], accounts: [] };
  document.getElementById("usage-month").textContent = used.month;
  const usageRow = (key) => (r) => el("tr", { [key]: r.name },
    el("td", {}, r.name), el("td", {}, r.gpu_hours.toFixed(1)), el("td", {}, r.jobs));
  rows(document.getElementById("usage-users"), used.users, usageRow("data-user"), "no GPU use this month");
  rows(document.getElementById("usage-accounts"), used.accounts, usageRow("data-account"), "no accounts");
}

// A booking over the next 24 hours, a character per half hour: `#` while booked.
function timeline(b, now) {
  let out = "";
  for (let i = 0; i < 48; i++) {
    out += b.start < now + (i + 1) * 1800 && now + i * 1800 < b.end ? "#" : ".";
  }
  return out;
}

function tick() {
  const live = document.getElementById("live");
  if (!last) return;
  const age = Date.now() / 1000 - last.now;
  const stale = age > Math.max(5, last.interval * 5);
  live.classList.toggle("stale", stale);
  live.textContent = (stale ? "not updating · " : "live · ") + `updated ${clock(last.now)}`;
}

function poll() {
  fetch("/api/v1/state", { cache: "no-store" })
    .then((r) => (r.ok ? r.json() : Promise.reject(new Error(r.status))))
    .then(draw)
    .catch(() => {})
    .finally(() => setTimeout(poll, last ? last.interval * 1000 : 2000));
}

function start() {
  setInterval(tick, 1000);
  if (!("EventSource" in window)) return poll();
  const events = new EventSource("/api/v1/events");
  events.onmessage = (e) => draw(JSON.parse(e.data));
  events.onerror = () => tick(); // EventSource reconnects by itself
}

start();
