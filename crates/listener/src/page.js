// The listener page's core (served as /page.js with page.html): the API and its banner,
// statistics, the message list and search, a trajectory's waterfall.
"use strict";
const STATES = ["sent","enqueued","delivered","consuming","consumed","failed","dead_lettered","stuck","lost"];
const SETTLED = ["consumed", "dead_lettered", "lost"];
const REFRESH_MS = 5000, FOLLOW_MS = 2000;
const $ = id => document.getElementById(id);
const token = new URLSearchParams(location.search).get("token") || localStorage.getItem("msgtrail-token");
if (token) localStorage.setItem("msgtrail-token", token);
const esc = s => String(s ?? "").replace(/[&<>"']/g, c => ({"&":"&amp;","<":"&lt;",">":"&gt;","\"":"&quot;","'":"&#39;"}[c]));
const ms = n => { const v = n / 1e6; return v >= 1000 ? (v/1000).toFixed(2) + " s" : v >= 10 ? v.toFixed(0) + " ms" : v.toFixed(1) + " ms"; };
// Never rounds up to 100 % (246 of 247 reads 99.5 %, not 100 %) nor down to 0 %.
function pct(a, b) {
  if (!b) return "";
  if (a === b) return " (100%)";
  const p = Math.floor(a * 1000 / b) / 10;
  return ` (${a > 0 && p === 0 ? "<0.1" : p}%)`;
}

// ---- times: a date and an explicit zone, UTC or local ----
let tz = localStorage.getItem("msgtrail-tz") === "local" ? "local" : "utc";
const p2 = (x, w = 2) => String(x).padStart(w, "0");
function zoneName() {
  if (tz === "utc") return "UTC";
  const off = -new Date().getTimezoneOffset(), a = Math.abs(off);
  return `UTC${off >= 0 ? "+" : "-"}${p2(Math.floor(a / 60))}:${p2(a % 60)}`;
}
function dateTime(n, zone = true) {
  const d = new Date(n / 1e6);
  const s = tz === "utc" ? d.toISOString().slice(0, 23).replace("T", " ")
    : `${d.getFullYear()}-${p2(d.getMonth() + 1)}-${p2(d.getDate())} ${p2(d.getHours())}:${p2(d.getMinutes())}:${p2(d.getSeconds())}.${p2(d.getMilliseconds(), 3)}`;
  return zone ? s + " " + zoneName() : s;
}
// A datetime-local value read in the chosen zone, as Unix nanoseconds (a decimal string).
function inputNanos(v) {
  if (!v) return null;
  const msec = tz === "utc" ? Date.parse(v + "Z") : new Date(v).getTime();
  return Number.isFinite(msec) ? (BigInt(msec) * 1000000n).toString() : null;
}

// ---- the API, and the banner when the listener cannot be reached ----
let lastGood = null, paused = false;
async function api(path) {
  let r;
  try {
    r = await fetch(path, { cache: "no-store", headers: token ? { Authorization: "Bearer " + token } : {} });
  } catch (e) {
    listenerDown(e);
    throw Object.assign(new Error("the listener cannot be reached"), { network: true });
  }
  listenerUp();
  const body = await r.json().catch(() => ({ error: r.statusText }));
  if (!r.ok) throw Object.assign(new Error(body.error || r.statusText), { status: r.status, body });
  return body;
}
function listenerDown(e) {
  $("banner").title = e.message;
  $("bannerText").textContent = "The listener cannot be reached. " +
    (lastGood ? `Showing the data as of ${dateTime(lastGood)}; ` : "") + `retrying every ${REFRESH_MS / 1000} s.`;
  $("banner").hidden = false;
}
function listenerUp() { lastGood = Date.now() * 1e6; $("banner").hidden = true; }

let traceUi = null;
api("/api/config").then(c => { traceUi = c.trace_ui_template || null; }).catch(() => {});
for (const s of STATES) { const o = document.createElement("option"); o.value = s; o.textContent = s; $("state").append(o); }

// ---- statistics ----
async function loadStats() {
  let s;
  try { s = await api("/api/stats"); }
  catch (err) { if (!err.network) $("statsBody").textContent = "statistics unavailable: " + err.message; return; }
  const states = STATES.filter(k => s.states[k]).map(k => `<span class="${k}">${k} ${s.states[k]}</span>`).join(" · ") || "none yet";
  const f = s.funnel, e = s.events;
  const e2e = s.latency.filter(r => r.segment === "end_to_end")
    .map(r => `<tr><td class="k">${esc(r.topic)}</td><td>p50 ${r.window.p50_ms.toFixed(1)} ms · p99 ${r.window.p99_ms.toFixed(1)} ms · ${r.window.count} group completions</td></tr>`).join("");
  $("statsBody").innerHTML = `<table>
    <tr><td class="k">states</td><td>${states}</td></tr>
    <tr><td class="k">funnel</td><td>sent ${f.sent} → stored ${f.stored}${pct(f.stored, f.sent)} → delivered ${f.delivered}${pct(f.delivered, f.sent)} → acked ${f.acked}${pct(f.acked, f.sent)}</td></tr>
    <tr><td class="k">events</td><td>duplicates ${e.duplicates} · stored again after the dedup window ${e.duplicates_after_window || 0} · redeliveries ${e.redeliveries} · dead letters ${e.dead_letters} · no-match ${e.no_match}</td></tr>
    <tr><td class="k">ingest</td><td>${s.ingest.records} records · lag ${s.lag.pending} stage batches, ${s.lag.stored_pending ?? 0} stored messages pending</td></tr>
    <tr><td colspan="2" class="dim">end to end, last ${s.window_secs} s (one sample per consumer group that consumed a message; ${f.acked} messages acked in all)</td></tr>${e2e}</table>`;
}

// ---- the list: search, keyboard, selection kept across refreshes ----
const BAD = ["failed", "dead_lettered", "stuck", "lost"];
// The summary's flags: a failure at any hop (even one a later attempt recovered from), a
// redelivery, a dead letter.
const hadFailure = m => !!m.failed || !!m.failure || BAD.includes(m.state) || Object.values(m.groups || {}).some(g => BAD.includes(g));
const rowId = m => m.message_id || m.request_id;
let listJson = "", selectedKey = null;
function searchQuery() {
  const f = $("search"), q = new URLSearchParams();
  for (const name of ["topic", "producer", "group", "attr", "state", "min_ms", "limit"]) {
    const v = f.elements[name].value.trim(); if (v) q.set(name, v);
  }
  for (const name of ["from", "to"]) { const n = inputNanos(f.elements[name].value); if (n) q.set(name, n); }
  for (const name of ["failed", "redelivered", "dead_letter"]) if (f.elements[name].checked) q.set(name, "true");
  return q.toString();
}
async function loadList(force) {
  let list;
  try { list = await api("/api/messages?" + searchQuery()); }
  catch (err) {
    if (!err.network) { listJson = ""; $("list").innerHTML = `<tr><td class="error">${esc(err.message)}</td></tr>`; $("count").textContent = ""; }
    return;
  }
  const json = JSON.stringify(list);
  if (json === listJson && !force) return; // nothing new: the list stays as it is under the cursor
  listJson = json;
  renderList(list);
}
// Draws the list: rows are drawn 500 at a time (one string, one insertion), more as the list
// scrolls or the keyboard reaches the end, so 10 000 listed messages stay fast.
const CHUNK = 500;
let listRows = [], drawn = 0;
function rowHtml(m) {
  const id = rowId(m), failed = hadFailure(m) && !BAD.includes(m.state);
  return `<tr class="msg" tabindex="-1" data-key="${esc(m.key)}" data-id="${esc(id)}" data-producer="${esc(m.message_id ? "" : m.producer)}" aria-selected="false">
    <td class="t">${dateTime(m.first_at, false)}</td><td>${esc(m.topic)}<div class="mono dim" title="${esc(id)}">${esc(m.message_id ? m.message_id.slice(0, 18) + "…" : "request " + m.request_id)}</div></td>
    <td class="${m.state}">${m.state}${failed ? ` <span class="warn mark-failed" title="${esc(m.failure || "a hop failed, a later attempt recovered")}">⚠ had a failure</span>` : ""}${
      m.redelivered ? ` <span class="warn mark-redelivered" title="delivered again to some group">↻ redelivered</span>` : ""}${
      m.dead_lettered && m.state !== "dead_lettered" ? ` <span class="warn mark-dead" title="some group dead-lettered it">✝ dead-lettered</span>` : ""}</td></tr>`;
}
function drawMore(upTo) {
  const end = Math.min(listRows.length, Math.max(upTo || 0, drawn + CHUNK));
  if (end <= drawn) return false;
  $("list").tBodies[0].insertAdjacentHTML("beforeend", listRows.slice(drawn, end).map(rowHtml).join(""));
  drawn = end;
  $("count").textContent = drawn < listRows.length ? `(${listRows.length} found, first ${drawn} drawn: scroll for more)` : `(${listRows.length} shown)`;
  return true;
}
function renderList(list) {
  const table = $("list"), hadFocus = table.contains(document.activeElement);
  const focusedKey = hadFocus ? document.activeElement.dataset.key : null;
  listRows = list; drawn = 0;
  table.innerHTML = `<thead><tr><th>first seen (${zoneName()})</th><th>topic, ID</th><th>state</th></tr></thead><tbody></tbody>`;
  // Down to the focused or open row, at least.
  const want = list.findIndex(m => m.key === (focusedKey || selectedKey));
  drawMore(want + 1);
  markSelected();
  const keep = focusedKey && table.querySelector(`tr.msg[data-key="${CSS.escape(focusedKey)}"]`);
  if (keep) { keep.tabIndex = 0; keep.focus({ preventScroll: true }); }
  else if (!table.querySelector('tr.msg[tabindex="0"]') && table.querySelector("tr.msg")) table.querySelector("tr.msg").tabIndex = 0;
}
document.querySelector(".listwrap").addEventListener("scroll", e => {
  const w = e.target;
  if (w.scrollTop + w.clientHeight > w.scrollHeight - 300) drawMore();
});
function markSelected() {
  for (const tr of $("list").querySelectorAll('tr.msg[aria-selected="true"]')) tr.setAttribute("aria-selected", "false");
  if (!current) return;
  const key = selectedKey, id = current.id;
  for (const tr of $("list").querySelectorAll("tr.msg")) {
    if ((key && tr.dataset.key === key) || (!key && tr.dataset.id === id)) {
      tr.setAttribute("aria-selected", "true");
      for (const o of $("list").querySelectorAll('tr.msg[tabindex="0"]')) o.tabIndex = -1;
      tr.tabIndex = 0;
      break;
    }
  }
}
function openRow(tr) { trace(tr.dataset.id, tr.dataset.producer, { key: tr.dataset.key }); }
$("list").addEventListener("click", e => { const tr = e.target.closest("tr.msg"); if (tr) { tr.focus(); openRow(tr); } });
$("list").addEventListener("keydown", e => {
  const tr = e.target.closest("tr.msg"); if (!tr) return;
  let next = null;
  if (e.key === "ArrowDown") next = tr.nextElementSibling || (drawMore() && tr.nextElementSibling);
  else if (e.key === "ArrowUp") next = tr.previousElementSibling;
  else if (e.key === "Home") next = $("list").querySelector("tr.msg");
  else if (e.key === "End") { drawMore(listRows.length); next = $("list").tBodies[0].lastElementChild; }
  else if (e.key === "Enter" || e.key === " ") { e.preventDefault(); openRow(tr); return; }
  if (next) { e.preventDefault(); tr.tabIndex = -1; next.tabIndex = 0; next.focus(); }
});
$("search").addEventListener("submit", e => { e.preventDefault(); loadList(true); });
$("search").addEventListener("reset", () => setTimeout(() => loadList(true)));
$("state").addEventListener("change", () => loadList(true));

// ---- a trajectory: the waterfall ----
let current = null, openHop = null, traceJson = "", traceSeq = 0, followTimer = null;
// The waterfall's zoom (a time range, Unix ns, or null: all of it), the range "all of it" is,
// and the groups whose hops are collapsed into one bar.
let zoom = null, fullRange = null, collapsed = new Set();
const enc = encodeURIComponent;
const clientLink = c => c ? `<a class="link client-link" href="#/clients/${esc(enc(c))}">${esc(c)}</a>` : "";
const groupLink = g => g ? `<a class="link group-link" href="#/groups/${esc(enc(g))}">${esc(g)}</a>` : "";
// Bounds are often below a millisecond: three decimals there.
const msb = n => Math.abs(n) < 1e6 ? (n / 1e6).toFixed(3) + " ms" : ms(n);
const signed = n => (n >= 0 ? "+" : "−") + msb(Math.abs(n));
// What a hop's times are sure to within, across clocks: its arrival (store: P1 → P2,
// process: C1/C5 → receipt) ± the best clock estimate's bound, or where it sits on the
// broker's clock.
// Returns [the bound, in words] (no bound for a hop timed by the broker alone: its clock
// estimate is only said).
function hopBound(h) {
  if (h.arrival_nanos != null) return [h.arrival_bound_nanos, `arrived after ${msb(h.arrival_nanos)} ± ${msb(h.arrival_bound_nanos)} (across two clocks)`];
  if (h.on_broker_clock) return [h.on_broker_clock.bound_nanos, `on the broker's clock within ± ${msb(h.on_broker_clock.bound_nanos)}`];
  if (h.clock) return [null, `${h.clock.client}'s clock ${signed(h.clock.offset_nanos)} ± ${msb(h.clock.bound_nanos)} against the broker's`];
  return [null, ""];
}
const STAGE_WORDS = { P1: "upload sent", P2: "broker received it, assigned the message id", P3: "stored",
  P4: "producer got the store-success notice", C1: "pushed to the consumer", C2: "consumer received it",
  C3: "consumer sent its settle", C4: "broker got the settle", C5: "fetched by the consumer",
  C6: "consumer received it", C7: "consumer sent its settle", C8: "broker got the settle",
  X1: "processing started", X2: "processing finished", N1: "no matching message", A1: "channel",
  R1: "redelivery scheduled", D1: "duplicate upload suppressed" };
// What a record says, in words (as `msgtrail trace` says it).
function describe(r) {
  let s = `${r.stage} ${r.stage === "R1" && r.outcome === "dead_letter" ? "dead-lettered" : STAGE_WORDS[r.stage] || ""}`;
  if (r.attempt) s += `, attempt ${r.attempt}`;
  if (r.outcome && r.stage !== "R1") s += `: ${r.outcome}`;
  if (r.detail) s += ` (${r.detail})`;
  if (r.service) s += ` [${r.service}]`;
  return s;
}
const hopLabel = h => `${h.kind}${h.group ? ` ${h.group}/${h.consumer || "?"}` : ""}${h.attempt ? " #" + h.attempt : ""}${h.mode ? ` (${h.mode})` : ""}${h.synthesized ? " (synthesized)" : ""}`;

function setInputError(msg) {
  $("qerr").textContent = msg;
  if (msg) $("q").setAttribute("aria-invalid", "true"); else $("q").removeAttribute("aria-invalid");
}
function setHash(id) {
  if (decodeURIComponent(location.hash.slice(1)) !== id) history.pushState(null, "", "#" + encodeURIComponent(id));
}

async function trace(id, producer, opts = {}) {
  id = (id || "").trim(); producer = producer || "";
  if (!id) return;
  const out = $("traceBody");
  if (!opts.refresh) {
    hideView();
    $("q").value = id; setInputError("");
    if (!current || current.id !== id || current.producer !== producer) { openHop = null; zoom = null; collapsed = new Set(); traceJson = ""; out.textContent = "loading…"; }
    if (!opts.fromHash) setHash(id);
    if (!opts.keepKey) selectedKey = opts.key || null;
    current = { id, producer, t: null };
    markSelected();
  }
  const seq = ++traceSeq;
  let t;
  try {
    t = await api("/api/messages/" + encodeURIComponent(id) + (producer ? "?producer=" + encodeURIComponent(producer) : ""));
  } catch (err) {
    if (seq !== traceSeq) return;
    if (err.network) { if (!current.t) out.innerHTML = `<b class="error">The listener cannot be reached</b>; retrying.`; follow(); return; }
    if (err.status === 404) out.innerHTML = `<b>Not found</b>: no stage record carries ${esc(id)} (yet).`;
    else if (err.status === 400) { setInputError("Not a message ID or request ID: " + err.message); out.innerHTML = `<b>Not a message ID or request ID</b>: ${esc(err.message)}`; }
    else if (err.status === 409) {
      out.innerHTML = `Request ID used by several producers: ${(err.body.producers || []).map(p => `<a href="#" data-p="${esc(p)}">${esc(p)}</a>`).join(", ")}`;
      for (const a of out.querySelectorAll("a[data-p]")) a.onclick = ev => { ev.preventDefault(); trace(id, a.dataset.p); };
    } else out.innerHTML = `<b class="error">Query failed</b>: ${esc(err.message)}`;
    traceJson = ""; current.t = null;
    if (err.status === 404) follow(); // it may arrive
    return;
  }
  if (seq !== traceSeq) return;
  current.t = t;
  const json = JSON.stringify(t);
  // Re-drawn when something changed, or while something waits (its "so far" grows).
  if (json !== traceJson || !SETTLED.includes(t.state) || t.hops.some(h => h.end == null)) { traceJson = json; render(t); }
  follow();
}
// A trajectory stays followed while it is open (another group may still receive it).
function follow() {
  clearTimeout(followTimer);
  followTimer = setTimeout(() => { if (current && !paused) trace(current.id, current.producer, { refresh: true }); else follow(); }, FOLLOW_MS);
}

function render(t) {
  const out = $("traceBody");
  const now = Math.max(Date.now() * 1e6, t.last_at);
  const settled = SETTLED.includes(t.state) && t.hops.every(h => h.end != null);
  const first = t.first_at;
  const fullEnd = settled ? Math.max(t.last_at, ...t.hops.map(h => h.end || h.start)) : now;
  fullRange = { from: first, to: fullEnd };
  if (zoom && zoom.from <= first && zoom.to >= fullEnd) zoom = null;
  const t0 = zoom ? zoom.from : first, end = zoom ? zoom.to : fullEnd;
  const span = Math.max(end - t0, 1);
  // Positions on the axis, cut to it when zoomed.
  const pos = x => Math.min(100, Math.max(0, (x - t0) / span * 100));
  const groupsOf = {};
  for (const h of t.hops) if (h.group) (groupsOf[h.group] = groupsOf[h.group] || []).push(h);
  const store = t.hops.find(h => h.kind === "store");
  const storedAt = store && store.end;
  // The previous delivery attempt's end, per group: a redelivery waits from there.
  const prevEnd = {};
  let waitingAt = null;
  const rows = [];
  const headed = new Set();
  for (const h of t.hops) {
    if (h.group && !headed.has(h.group)) { headed.add(h.group); rows.push(groupRow(t, h.group, groupsOf[h.group], pos, now)); }
    if (h.group && collapsed.has(h.group)) {
      if (h.kind === "deliver") prevEnd[h.group] = h.end == null ? now : h.end;
      continue;
    }
    const open = h.end == null;
    const hEnd = open ? now : h.end;
    let segs = "";
    let wait = null;
    if (h.kind === "deliver") {
      const from = prevEnd[h.group] ?? storedAt;
      if (from != null && from < h.start) wait = { from, to: h.start, label: prevEnd[h.group] != null ? "redelivery wait" : "queue wait" };
      prevEnd[h.group] = hEnd;
    }
    if (wait) segs += `<span class="seg-wait" data-wait="${wait.to - wait.from}" style="left:${pos(wait.from)}%;width:${pos(wait.to) - pos(wait.from)}%" title="${wait.label} ${ms(wait.to - wait.from)} (stored → delivered)"></span>`;
    segs += `<span class="${open ? "seg-waiting" : "seg-" + h.status}" data-dur="${hEnd - h.start}" style="left:${pos(h.start)}%;width:${pos(hEnd) - pos(h.start)}%" title="${esc(hopLabel(h))}: ${ms(hEnd - h.start)}"></span>`;
    if (open && !settled) waitingAt = h;
    const [bound, boundWords] = hopBound(h);
    const dur = (open ? `<span class="incomplete">${ms(now - h.start)} so far</span>`
      : h.impossible ? `<span class="impossible" title="${esc(h.impossible)}">?</span>` : ms(h.end - h.start))
      + (bound != null ? `<div class="bound" title="${esc(boundWords)}">± ${msb(bound)}</div>` : "");
    const indent = h.kind === "process" ? "&nbsp;&nbsp;&nbsp;" : "";
    const expanded = openHop === h.key;
    rows.push(`<tr class="hop" tabindex="0" data-key="${esc(h.key)}" aria-expanded="${expanded}">
      <td title="${esc(hopLabel(h))}">${indent}<b>${esc(h.kind)}</b>${esc(hopLabel(h).slice(h.kind.length))}${h.impossible ? `<div class="impossible-why dim" style="font-size:12px">? ${esc(h.impossible)}</div>` : ""}</td>
      <td class="n off">+${ms(h.start - t0)}</td><td class="n">${dur}</td>
      <td><div class="track">${segs}</div>${wait ? `<div class="dim" style="font-size:12px">${wait.label} ${ms(wait.to - wait.from)}</div>` : ""}${
        boundWords ? `<div class="bound clockline">${esc(boundWords)}</div>` : ""}</td>
      <td class="${open ? "incomplete" : h.status}">${open ? "waiting" : h.status}</td></tr>`);
    if (expanded) rows.push(`<tr class="detail"><td colspan="5">${hopDetail(h, t0)}</td></tr>`);
  }
  // Stored and delivered to no group yet: it waits in the queue.
  if (!settled && storedAt != null && !t.hops.some(h => h.kind === "deliver") && ["enqueued", "stuck"].includes(t.state)) {
    rows.push(`<tr class="hop queue"><td><b>queue</b> (no delivery yet)</td><td class="n off">+${ms(storedAt - t0)}</td>
      <td class="n"><span class="incomplete">${ms(now - storedAt)} so far</span></td>
      <td><div class="track"><span class="seg-waiting" style="left:${pos(storedAt)}%;width:${pos(now) - pos(storedAt)}%"></span></div></td><td class="incomplete">waiting</td></tr>`);
    waitingAt = { queue: true, start: storedAt };
  }
  let waiting = "";
  if (!settled && t.state !== "consumed") {
    const at = waitingAt ? (waitingAt.queue ? "in the queue (stored, delivered to no group yet)" : "at " + hopLabel(waitingAt)) : "after its last record";
    const since = waitingAt ? waitingAt.start : t.last_at;
    waiting = `<div class="waiting" id="waiting"><b class="${t.state}">${t.state}</b>: waiting ${ms(now - since)} so far ${esc(at)}, since ${dateTime(since)}.</div>`;
  }
  const groups = t.groups.map(g => `<tr><td>${groupLink(g.group)}</td><td class="${g.state}">${g.state}</td><td>${g.attempts} attempt(s)</td>
    <td>${g.end_to_end_nanos != null ? "end to end " + ms(g.end_to_end_nanos) : ""}</td><td>${g.last_error ? "last error: " + esc(g.last_error) : ""}</td></tr>`).join("");
  const attrs = Object.entries(t.attrs || {}).map(([k, v]) => `${esc(k)}=${esc(v)}`).join(" ");
  const others = t.same_request || [];
  const same = others.length ? `<div class="incomplete">request ${esc(t.request_id)} stored as ${others.length + 1} messages (uploaded again after the dedup window): ${
    [...others, t.message_id].sort().map(m => m === t.message_id ? `<span class="mono">${esc(m)}</span> (this one)` : `<a href="#${esc(encodeURIComponent(m))}" class="mono">${esc(m)}</a>`).join(", ")}</div>` : "";
  const link = traceUi && t.trace_id ? ` · <a href="${esc(traceUi.replace("{trace_id}", t.trace_id))}" target="_blank" rel="noopener">open trace</a>` : "";
  const ticks = [0, 0.25, 0.5, 0.75, 1].map(f => `<span>+${ms(t0 - first + span * f)}</span>`).join("");
  const clocks = (t.clocks || []).map(c => `<tr><td>${clientLink(c.client)}</td><td>${c.broker ? "vs broker " + esc(c.broker) : ""}</td><td>${signed(c.offset_nanos)} ± ${msb(c.bound_nanos)}</td>
    <td>round trip ${msb(c.round_trip_nanos)}</td><td>${c.samples} exchange(s)</td></tr>`).join("");
  const zoomBar = `<div class="zoom" id="zoomBar"><span>zoom</span><button type="button" data-zoom="in" id="zoomIn" title="twice as close, around the middle">+</button>
    <button type="button" data-zoom="out" id="zoomOut" title="twice as far">−</button><button type="button" data-zoom="reset" id="zoomReset"${zoom ? "" : " disabled"}>reset</button>
    <span class="dim" id="zoomRange">${zoom ? `showing +${ms(t0 - first)} … +${ms(end - first)} of ${ms(fullEnd - first)}` : "drag across the bars to zoom into a time range"}</span></div>`;
  out.innerHTML = `<div class="kv"><span class="mono">${esc(t.message_id || "no message ID")}</span>
      <span>state <b class="${t.state}">${t.state}</b></span><span>topic ${esc(t.topic)}</span>
      <span>producer ${clientLink(t.producer)}</span><span>request ${esc(t.request_id)}</span></div>
    ${same}
    <div class="kv dim"><span>first record ${dateTime(t0)}</span><span>trace <span class="mono">${esc(t.trace_id)}</span>${link}</span>${attrs ? `<span>${attrs}</span>` : ""}</div>
    <div class="kv dim" id="upload"><span>${t.payload_size != null ? t.payload_size + " bytes" : "size unknown"}</span><span>${t.upload_attempts} upload attempt(s)</span><span>${t.duplicates} duplicate(s) suppressed</span></div>
    ${t.payload_head != null ? payloadHead(t.payload_head, t.payload_size) : ""}
    ${waiting}
    ${zoomBar}
    <table class="wf" data-span="${span}"><colgroup><col class="c-hop"><col class="c-off"><col class="c-dur"><col><col class="c-st"></colgroup>
      <thead><tr><th>hop</th><th class="n off">offset</th><th class="n">took</th><th><div class="axis" data-from="${t0 - first}" data-to="${end - first}">${ticks}</div></th><th>status</th></tr></thead>
      <tbody>${rows.join("")}</tbody></table>
    <div class="dim" style="font-size:12px">Bars share one time axis from the first record; striped: waiting in the queue (stored → delivered) or still open. Click a hop for its detail.</div>
    ${groups ? "<h3>Consumer groups</h3><table>" + groups + "</table>" : ""}
    ${clocks ? `<h3>Clocks against the broker's</h3><table id="clocks">${clocks}</table>` : ""}
    <p class="diag"><b>Diagnosis:</b> ${esc(t.diagnosis)}</p>
    ${t.failure ? `<p class="error">Failure point: ${esc(t.failure)}</p>` : ""}`;
}
// The payload's first bytes (base64 in the API): as text when they are UTF-8 text.
function payloadHead(b64, size) {
  let text = null;
  try {
    const bytes = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
    text = new TextDecoder("utf-8", { fatal: true }).decode(bytes);
    if (/[\u0000-\u0008\u000e-\u001f]/.test(text)) text = null;
  } catch (e) { text = null; }
  const cut = size != null && size > (b64.length * 3) / 4 ? "…" : "";
  return `<div class="dim" style="font-size:12.5px">payload head (${text != null ? "text" : "base64"})</div><pre class="payload">${esc(text != null ? text : b64)}${cut}</pre>`;
}
function hopDetail(h, t0) {
  const dl = [["span ID", `<span class="mono">${esc(h.span_id || "—")}</span>`], ["hop", esc(h.key)],
    ["started", `${dateTime(h.start)} (+${ms(h.start - t0)})`], ["ended", h.end != null ? dateTime(h.end) : "not yet"],
    ["latency", h.impossible ? `<span class="impossible">?</span> ${esc(h.impossible)}` : h.latency_nanos != null ? ms(h.latency_nanos) : "—"],
    ["status", `${h.status}${h.reason ? " — " + esc(h.reason) : ""}`]];
  if (h.group) dl.push(["consumer", `${groupLink(h.group)}/${clientLink(h.consumer)}, attempt ${h.attempt}${h.mode ? ", " + h.mode : ""}${h.by_id ? ", fetched by ID" : ""}`]);
  if (h.arrival_nanos != null) dl.push(["arrival", `${msb(h.arrival_nanos)} ± ${msb(h.arrival_bound_nanos)} after the other side sent it (across the two clocks)`]);
  if (h.on_broker_clock) { const c = h.on_broker_clock; dl.push(["on the broker's clock", `${dateTime(c.start)} → ${c.end != null ? dateTime(c.end) : "not yet"}, ± ${msb(c.bound_nanos)}`]); }
  if (h.clock) dl.push(["clock (this hop)", `${clientLink(h.clock.client)} ${signed(h.clock.offset_nanos)} ± ${msb(h.clock.bound_nanos)} against the broker, round trip ${msb(h.clock.round_trip_nanos)}`]);
  if (h.broker) dl.push(["broker instance", `<span class="mono">${esc(h.broker)}</span>`]);
  if (h.service) dl.push(["service", esc(h.service)]);
  if (h.inferred) dl.push(["note", "times inferred, not measured"]);
  const ev = h.events.map(r => `<li><span class="mono">${dateTime(r.at)}</span> ${esc(describe(r))}</li>`).join("");
  return `<dl>${dl.map(([k, v]) => `<dt>${k}</dt><dd>${v}</dd>`).join("")}</dl><b>Events</b><ol class="events">${ev}</ol>`;
}
// A group's heading in the waterfall: its button collapses its hops into one bar (its first
// start to its last end) and expands them again.
function groupRow(t, g, hops, pos, now) {
  const c = collapsed.has(g), from = Math.min(...hops.map(h => h.start)), to = Math.max(...hops.map(h => h.end == null ? now : h.end));
  const st = (t.groups.find(x => x.group === g) || {}).state || "";
  return `<tr class="grp" data-group="${esc(g)}"><td><button type="button" class="collapse" data-group="${esc(g)}" aria-expanded="${!c}" title="${c ? "expand" : "collapse"} the group's hops">${c ? "▸" : "▾"}</button>
    group ${groupLink(g)} <span class="dim">${hops.length} hop(s)</span> · <span class="${st}">${st}</span></td><td class="n off">+${ms(from - t.first_at)}</td><td class="n">${c ? ms(to - from) : ""}</td>
    <td>${c ? `<div class="track"><span class="seg-group" data-group-dur="${to - from}" style="left:${pos(from)}%;width:${pos(to) - pos(from)}%"></span></div>` : ""}</td><td></td></tr>`;
}
// Zoom: twice as close around the middle, twice as far, or all of it.
function setZoom(how) {
  if (!fullRange) return;
  const cur = zoom || fullRange, mid = (cur.from + cur.to) / 2, half = (cur.to - cur.from) / 2;
  if (how === "reset") zoom = null;
  else if (how === "in") zoom = { from: mid - half / 2, to: mid + half / 2 };
  else if (how === "out") {
    const from = Math.max(fullRange.from, mid - half * 2), to = Math.min(fullRange.to, mid + half * 2);
    zoom = from <= fullRange.from && to >= fullRange.to ? null : { from, to };
  }
  if (current && current.t) render(current.t);
}
// Dragging across the bars zooms into the range dragged over.
let drag = null, dragged = false;
$("traceBody").addEventListener("mousedown", e => {
  const track = e.target.closest("table.wf .track"); if (!track || e.button !== 0) return;
  const r = track.getBoundingClientRect();
  drag = { left: r.left, width: r.width, x: e.clientX };
});
window.addEventListener("mouseup", e => {
  if (!drag) return;
  const d = drag; drag = null;
  if (Math.abs(e.clientX - d.x) < 4 || !fullRange) return;
  const cur = zoom || fullRange, f = x => Math.min(1, Math.max(0, (x - d.left) / d.width));
  const a = f(Math.min(d.x, e.clientX)), b = f(Math.max(d.x, e.clientX)), span = cur.to - cur.from;
  zoom = { from: cur.from + a * span, to: cur.from + b * span };
  dragged = true; setTimeout(() => { dragged = false; });
  if (current && current.t) render(current.t);
});
$("traceBody").addEventListener("click", e => {
  if (dragged) { dragged = false; return; }
  if (e.target.closest("a")) return; // links go where they say
  const zb = e.target.closest("button[data-zoom]"); if (zb) { setZoom(zb.dataset.zoom); return; }
  const cb = e.target.closest("button.collapse");
  if (cb && current && current.t) {
    const g = cb.dataset.group;
    if (collapsed.has(g)) collapsed.delete(g); else collapsed.add(g);
    render(current.t);
    const again = $("traceBody").querySelector(`button.collapse[data-group="${CSS.escape(g)}"]`); if (again) again.focus();
    return;
  }
  const tr = e.target.closest("tr.hop[data-key]"); if (!tr || !current || !current.t) return;
  openHop = openHop === tr.dataset.key ? null : tr.dataset.key;
  render(current.t);
  const again = $("traceBody").querySelector(`tr.hop[data-key="${CSS.escape(tr.dataset.key)}"]`); if (again) again.focus();
});
$("traceBody").addEventListener("keydown", e => {
  if ((e.key === "Enter" || e.key === " ") && e.target.matches("tr.hop[data-key]")) { e.preventDefault(); e.target.click(); }
});

