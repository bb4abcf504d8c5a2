// The listener page's trajectory view (served as /page-trace.js after page-list.js): a
// waterfall of its hops on one time axis counted from the first record (the offsets, the
// ticks and the hop detail all count from there), with ticks whose precision follows the
// zoom, a minimap of the whole trajectory with a brush, zoom towards the cursor (Ctrl+wheel)
// or the open hop, dead letters and redeliveries marked with their reason, the groups still
// waiting, and a hop detail like a span's in Jaeger: the exported attributes, copy buttons,
// links into the tracing UI, and the trajectory as a JSON download.
"use strict";
let current = null, openHop = null, traceJson = "", traceSeq = 0, followTimer = null;
// The waterfall's zoom (a time range, Unix ns, or null: all of it), the range "all of it" is,
// and the groups whose hops are collapsed into one bar.
let zoom = null, fullRange = null, collapsed = new Set();
// The exported spans of the open trajectory, per hop key (GET /api/messages/{id}/spans).
let spans = null, spansFor = "";
let downloadUrl = null;
const clientLink = c => c ? `<a class="link client-link" href="#/clients/${esc(enc(c))}">${esc(c)}</a>` : "";
const groupLink = g => g ? `<a class="link group-link" href="#/groups/${esc(enc(g))}">${esc(g)}</a>` : "";
const copyButton = (value, what) => value ? `<button type="button" class="copy" data-copy="${esc(value)}" aria-label="Copy the ${esc(what)}" title="copy the ${esc(what)}">copy</button>` : "";
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
    if (!current || current.id !== id || current.producer !== producer) { openHop = null; zoom = null; collapsed = new Set(); traceJson = ""; spans = null; spansFor = ""; out.textContent = "loading…"; }
    if (!opts.fromHash) setHash(id);
    if (!opts.keepKey) selectedKey = opts.key || null;
    current = { id, producer, t: null, announced: false };
    markSelected();
  }
  const seq = ++traceSeq;
  let t;
  try {
    t = await api("/api/messages/" + encodeURIComponent(id) + (producer ? "?producer=" + encodeURIComponent(producer) : ""));
  } catch (err) {
    if (seq !== traceSeq) return;
    if (opts.reveal) revealTrace();
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
  if (!current.announced) { current.announced = true; announce(`Trajectory of ${t.message_id || id}: ${t.state}`); }
  const json = JSON.stringify(t);
  // Re-drawn when something changed, or while something waits (its "so far" grows).
  if (json !== traceJson || !SETTLED.includes(t.state) || t.hops.some(h => h.end == null)) { traceJson = json; render(t); }
  if (opts.reveal) revealTrace();
  if (openHop && spansFor !== json) loadSpans(json);
  follow();
}
// A trajectory stays followed while it is open (another group may still receive it).
function follow() {
  clearTimeout(followTimer);
  followTimer = setTimeout(() => { if (current && !paused) trace(current.id, current.producer, { refresh: true }); else follow(); }, FOLLOW_MS);
}
// The exported spans of the open trajectory as it stands (`json`), for the hop detail.
async function loadSpans(json) {
  spansFor = json;
  const c = current;
  try {
    const body = await api("/api/messages/" + enc(c.id) + "/spans" + (c.producer ? "?producer=" + enc(c.producer) : ""));
    if (c !== current) return;
    spans = new Map(body.spans.map(s => [s.hop, s]));
  } catch (e) { spans = new Map(); spansFor = ""; }
  if (current && current.t && openHop) render(current.t);
}

// ---- the time axis: nice ticks whose precision follows the zoom ----
const UNITS = [[1e9, "s"], [1e6, "ms"], [1e3, "µs"], [1, "ns"]];
// Ticks over [a, b] (nanoseconds from the first record): a step of 1, 2 or 5 × 10^k giving
// about `want` ticks, each written with the decimals that step needs.
function axisTicks(a, b, want = 5) {
  const span = Math.max(b - a, 1), raw = span / want, p = 10 ** Math.floor(Math.log10(raw)), m = raw / p;
  const step = (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
  const [unit, name] = UNITS.find(([u]) => step >= u) || UNITS[3];
  const decimals = Math.max(0, Math.ceil(-Math.log10(step / unit) - 1e-9));
  const out = [];
  for (let k = Math.ceil(a / step - 1e-9); k * step <= b + step * 1e-9; k++) {
    out.push({ at: k * step, label: "+" + (k * step / unit).toFixed(decimals) + " " + name });
  }
  return out;
}

// The axis's tick labels over [a, b] for an axis `axisPx` wide: about one per 90 px, fewer
// while their labels (about 7 px a character, 14 px between them) would touch, and every
// n-th kept when still crowded (never fewer than two). None in the last 8 %, where its label
// would run off the axis.
function axisHtml(a, b, span, axisPx) {
  const at = k => (k.at - a) / span * 100;
  const onAxis = k => at(k) <= 92;
  let want = Math.max(2, Math.min(8, Math.floor(axisPx / 90)));
  let marks = axisTicks(a, b, want);
  const labelPx = () => Math.max(0, ...marks.map(k => k.label.length)) * 7 + 14;
  while (want > 2 && labelPx() > axisPx / marks.length) marks = axisTicks(a, b, --want);
  marks = marks.filter(onAxis);
  // A coarse step can leave a single tick (or none) once the last 8 % is cut: a denser one
  // until two are on the axis (the thinning below keeps them apart).
  for (let w = want + 1; marks.length < 2 && w <= 16; w++) marks = axisTicks(a, b, w).filter(onAxis);
  // Still crowded: every n-th label, never fewer than two.
  const every = Math.min(Math.max(1, marks.length - 1), Math.max(1, Math.ceil(labelPx() / (axisPx / Math.max(1, marks.length)))));
  if (every > 1) marks = marks.filter((_, i) => i % every === 0);
  return marks.map(k => `<span style="left:${at(k).toFixed(2)}%" class="${at(k) < 6 ? "first" : ""}">${k.label}</span>`).join("");
}

function render(t) {
  const out = $("traceBody");
  const now = Math.max(nowNanos(), t.last_at);
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
    const mark = hopMark(t, h);
    if (wait) segs += `<span class="seg-wait" data-wait="${wait.to - wait.from}" style="left:${pos(wait.from)}%;width:${pos(wait.to) - pos(wait.from)}%" title="${wait.label} ${dur(wait.to - wait.from)} (stored → delivered)"></span>`;
    segs += `<span class="${open ? "seg-waiting" : "seg-" + h.status}${mark ? " " + mark.cls : ""}" data-dur="${hEnd - h.start}" style="left:${pos(h.start)}%;width:${pos(hEnd) - pos(h.start)}%" title="${esc(hopLabel(h))}: ${dur(hEnd - h.start)}"></span>`;
    if (mark) segs += `<i class="flag ${mark.cls}" style="left:${pos(hEnd)}%" aria-hidden="true">${mark.sign}</i>`;
    if (open && !settled) waitingAt = h;
    const [bound, boundWords] = hopBound(h);
    const took = (open ? `<span class="incomplete">${dur(now - h.start)} so far</span>`
      : h.impossible ? `<span class="impossible" title="${esc(h.impossible)}">?</span>` : dur(h.end - h.start))
      + (bound != null ? `<div class="bound" title="${esc(boundWords)}">± ${msb(bound)}</div>` : "");
    const indent = h.kind === "process" ? "&nbsp;&nbsp;&nbsp;" : "";
    const expanded = openHop === h.key;
    rows.push(`<tr class="hop" tabindex="0" data-key="${esc(h.key)}" aria-expanded="${expanded}">
      <td title="${esc(hopLabel(h))}">${indent}<b>${esc(h.kind)}</b>${esc(hopLabel(h).slice(h.kind.length))}${h.impossible ? `<div class="impossible-why dim" style="font-size:12px">? ${esc(h.impossible)}</div>` : ""}</td>
      <td class="n off">+${dur(h.start - first)}</td><td class="n">${took}</td>
      <td><div class="track">${segs}</div>${wait ? `<div class="dim" style="font-size:12px">${wait.label} ${dur(wait.to - wait.from)}</div>` : ""}${
        mark ? `<div class="mark ${mark.cls}">${mark.sign} ${esc(mark.words)}</div>` : ""}${
        boundWords ? `<div class="bound clockline">${esc(boundWords)}</div>` : ""}</td>
      <td class="${open ? "incomplete" : h.status}">${open ? "waiting" : h.status}</td></tr>`);
    if (expanded) rows.push(`<tr class="detail"><td colspan="5">${hopDetail(t, h)}</td></tr>`);
  }
  // Stored and delivered to no group yet: it waits in the queue.
  if (!settled && storedAt != null && !t.hops.some(h => h.kind === "deliver") && ["enqueued", "stuck"].includes(t.state)) {
    rows.push(`<tr class="hop queue"><td><b>queue</b> (no delivery yet)</td><td class="n off">+${dur(storedAt - first)}</td>
      <td class="n"><span class="incomplete">${dur(now - storedAt)} so far</span></td>
      <td><div class="track"><span class="seg-waiting" style="left:${pos(storedAt)}%;width:${pos(now) - pos(storedAt)}%"></span></div></td><td class="incomplete">waiting</td></tr>`);
    waitingAt = { queue: true, start: storedAt };
  }
  let waiting = "";
  if (!settled && t.state !== "consumed") {
    const at = waitingAt ? (waitingAt.queue ? "in the queue (stored, delivered to no group yet)" : "at " + hopLabel(waitingAt)) : "after its last record";
    const since = waitingAt ? waitingAt.start : t.last_at;
    waiting = `<div class="waiting" id="waiting"><b class="${t.state}">${t.state}</b>: waiting ${dur(now - since)} so far ${esc(at)}, since ${dateTime(since)}.</div>`;
  }
  const groups = t.groups.map(g => `<tr><td>${groupLink(g.group)}</td><td class="${g.state}">${g.state}</td><td>${g.attempts} attempt(s)</td>
    <td>${g.end_to_end_nanos != null ? "end to end " + dur(g.end_to_end_nanos) : ""}</td><td>${g.last_error ? "last error: " + esc(g.last_error) : ""}</td></tr>`).join("");
  const attrs = Object.entries(t.attrs || {}).map(([k, v]) => `${esc(k)}=${esc(v)}`).join(" ");
  const others = t.same_request || [];
  const same = others.length ? `<div class="incomplete">request ${esc(t.request_id)} stored as ${others.length + 1} messages (uploaded again after the dedup window): ${
    [...others, t.message_id].sort().map(m => m === t.message_id ? `<span class="mono">${esc(m)}</span> (this one)` : `<a href="#${esc(encodeURIComponent(m))}" class="mono">${esc(m)}</a>`).join(", ")}</div>` : "";
  const traceHref = uiLink(traceUi, t.trace_id);
  const link = traceHref ? ` <a id="traceLink" href="${esc(traceHref)}" target="_blank" rel="noopener">open the trace in the tracing UI</a>` : "";
  const ticks = axisHtml(t0 - first, end - first, span, ($("traceBody").clientWidth || 800) * 0.35);
  const clocks = (t.clocks || []).map(c => `<tr><td>${clientLink(c.client)}</td><td>${c.broker ? "vs broker " + esc(c.broker) : ""}</td><td>${signed(c.offset_nanos)} ± ${msb(c.bound_nanos)}</td>
    <td>round trip ${msb(c.round_trip_nanos)}</td><td>${c.samples} exchange(s)</td></tr>`).join("");
  const zoomBar = `<div class="zoom" id="zoomBar"><span>zoom</span><button type="button" data-zoom="in" id="zoomIn" aria-label="Zoom in" title="twice as close, around the open hop (else the middle); Ctrl+wheel over the bars zooms at the cursor">+</button>
    <button type="button" data-zoom="out" id="zoomOut" aria-label="Zoom out" title="twice as far">−</button><button type="button" data-zoom="reset" id="zoomReset"${zoom ? "" : " disabled"}>show all</button>
    <span class="dim" id="zoomRange">${zoom ? `showing +${dur(t0 - first)} … +${dur(end - first)} of ${dur(fullEnd - first)}` : "drag across the bars or the overview to zoom into a time range"}</span></div>`;
  const fname = `msgtrail-${t.message_id || t.request_id || "trajectory"}.json`;
  if (downloadUrl) URL.revokeObjectURL(downloadUrl);
  // The answer as the API gave it (its exact Unix nanoseconds), not as the page keeps it.
  downloadUrl = URL.createObjectURL(new Blob([rawOf.get(t) || JSON.stringify(t)], { type: "application/json" }));
  out.innerHTML = `<div class="kv"><span class="mono">${esc(t.message_id || "no message ID")}</span>${copyButton(t.message_id, "message ID")}
      <span>state <b class="${t.state}">${t.state}</b></span><span>topic ${esc(t.topic)}</span>
      <span>producer ${clientLink(t.producer)}</span><span>request ${esc(t.request_id)}</span>
      <a id="download" href="${downloadUrl}" download="${esc(fname)}">download JSON</a></div>
    ${same}
    <div class="kv dim"><span>first record ${dateTime(first)} (the waterfall's +0)</span><span>trace <span class="mono">${esc(t.trace_id)}</span>${copyButton(t.trace_id, "trace ID")}${link}</span>${attrs ? `<span>${attrs}</span>` : ""}</div>
    <div class="kv dim" id="upload"><span>${t.payload_size != null ? t.payload_size + " bytes" : "size unknown"}</span><span>${t.upload_attempts} upload attempt(s)</span><span>${t.duplicates} duplicate(s) suppressed</span></div>
    ${t.payload_head != null ? payloadHead(t.payload_head, t.payload_size) : ""}
    ${observedHtml(t.observed)}
    ${waiting}${groupsWaiting(t, now)}
    ${zoomBar}
    ${minimap(t, first, fullEnd, now)}
    <table class="wf" data-span="${span}"><colgroup><col class="c-hop"><col class="c-off"><col class="c-dur"><col><col class="c-st"></colgroup>
      <thead><tr><th>hop</th><th class="n off">offset</th><th class="n">took</th><th><div class="axis" data-from="${t0 - first}" data-to="${end - first}">${ticks}</div></th><th>status</th></tr></thead>
      <tbody>${rows.join("")}</tbody></table>
    <div class="dim" style="font-size:12px">Offsets and ticks count from the first record. Striped: waiting in the queue (stored → delivered) or still open; ✝ dead-lettered, ↻ delivered again. Click a hop for its detail; + and − on a focused hop zoom towards it.</div>
    ${groups ? "<h3>Consumer groups</h3><table>" + groups + "</table>" : ""}
    ${clocks ? `<h3>Clocks against the broker's</h3><table id="clocks">${clocks}</table>` : ""}
    <p class="diag"><b>Diagnosis:</b> ${esc(t.diagnosis)}</p>
    ${t.failure ? `<p class="error">Failure point: ${esc(t.failure)}</p>` : ""}`;
  // The ticks again at the axis's real width, now that it is laid out: the same for every
  // render of the same range, whatever was drawn before.
  const axisEl = out.querySelector("table.wf .axis");
  if (axisEl && axisEl.clientWidth) {
    axisEl.innerHTML = axisHtml(t0 - first, end - first, span, axisEl.clientWidth);
    dropTouchingTicks(axisEl);
  }
}
// The labels as the browser laid them out: one that would touch the label kept before it is
// dropped (the 7 px-a-character estimate above is only an estimate: fonts differ, and µs is
// wider than ms). The first label is always kept.
function dropTouchingTicks(axisEl) {
  let keptRight = -Infinity;
  for (const label of [...axisEl.children]) {
    const r = label.getBoundingClientRect();
    if (r.left < keptRight + 6) label.remove(); else keptRight = r.right;
  }
}
// What a deliver hop's bar is marked with: a dead letter (the broker's R1 says why) or a
// redelivery (a later attempt of the same group; why: the attempt's failure).
function hopMark(t, h) {
  if (h.kind !== "deliver") return null;
  const dead = h.events.find(r => r.stage === "R1" && r.outcome === "dead_letter");
  const process = t.hops.find(p => p.kind === "process" && p.parent === h.key);
  // Why: the failure's own words (the consumer's detail), with the hop's reason.
  const why = () => {
    const detail = ([...(process ? process.events : []), ...h.events].find(r => r.detail && r.stage !== "R1") || {}).detail;
    const reason = (process && process.reason) || h.reason;
    return detail && reason ? `${detail} (${reason})` : detail || reason || "";
  };
  if (dead) return { cls: "dead", sign: "✝", words: `dead-lettered${dead.detail || why() ? ": " + (dead.detail || why()) : ""}` };
  const again = t.hops.find(o => o.kind === "deliver" && o.group === h.group && !!o.by_id === !!h.by_id && o.attempt === h.attempt + 1);
  if (again) return { cls: "again", sign: "↻", words: `delivered again (attempt ${again.attempt})${why() ? " after: " + why() : ""}` };
  return null;
}
// The groups that have not settled it while others have: consumed is not the end for them.
// Observe mode (a JetStream stream msgtrail does not own): where the message is, whether
// its stored copy was read, the consumers that may lack hops (they do not sample every
// ack) with the command that fixes each, and what observe mode cannot see.
function observedHtml(o) {
  if (!o) return "";
  const where = `stream <b class="mono">${esc(o.stream)}</b>, sequence <b class="mono">${o.stream_seq}</b>${o.nats_msg_id ? `, Nats-Msg-Id <span class="mono">${esc(o.nats_msg_id)}</span>` : ""}`;
  const joins = o.joins ? ` · joins the producer's trace <span class="mono">${esc(o.joins.trace_id)}</span> (child of its span <span class="mono">${esc(o.joins.parent_span_id)}</span>)` : "";
  const stored = o.stored === false ? `<div class="unread">Its stored message was not read (a work-queue stream, or gone before it was read): no store hop, no subject, Nats-Msg-Id or traceparent.</div>` : "";
  const unsampled = (o.unsampled || []).map(u => `<li class="unsampled" data-consumer="${esc(u.consumer)}"><b>${esc(u.consumer)}</b> samples ${u.sample_freq || 0} % of its acks (sample_freq): nats-server reports ${u.sample_freq ? "only some of" : "none of"} its acked deliveries, so its hops may be missing here.
    Fix: <code class="fix">${esc(u.fix)}</code>${copyButton(u.fix, "command")}</li>`).join("");
  return `<div class="observed" id="observed"><div><span class="badge">source: observed</span> built from nats-server's own events, ${where}${joins}</div>${stored}
    ${unsampled ? `<div class="warn-box" id="unsampled">⚠ Hops may be missing: <ul>${unsampled}</ul></div>` : ""}
    <details><summary>What observe mode cannot see</summary><ul>${(o.unseen || []).map(u => `<li>${esc(u)}</li>`).join("")}</ul></details></div>`;
}
function groupsWaiting(t, now) {
  const open = t.groups.filter(g => !SETTLED.includes(g.state));
  if (!open.length || open.length === t.groups.length && t.state !== "consumed") return "";
  const since = g => Math.max(...t.hops.filter(h => h.group === g.group).map(h => h.start));
  return `<div class="waiting" id="groupsWaiting"><b>Still waiting</b> for ${open.length} of ${t.groups.length} group(s): ${open.map(g =>
    `${groupLink(g.group)} <span class="${g.state}">${g.state}</span>, ${dur(now - since(g))} so far`).join("; ")}.</div>`;
}
// The whole trajectory at a glance, with the zoomed range as a brush: drag across it to
// choose a range, drag the brush to move it.
function minimap(t, first, fullEnd, now) {
  const span = Math.max(fullEnd - first, 1), n = Math.max(t.hops.length, 1), row = Math.max(2, Math.min(6, 36 / n));
  const at = x => ((x - first) / span * 100).toFixed(3);
  const bars = t.hops.map((h, i) => `<i class="mm-${h.end == null ? "waiting" : h.status}" style="left:${at(h.start)}%;width:${Math.max(0.2, ((h.end ?? now) - h.start) / span * 100).toFixed(3)}%;top:${(i * row).toFixed(1)}px;height:${Math.max(1, row - 1).toFixed(1)}px"></i>`).join("");
  const brush = zoom ? `<div class="mm-brush" id="mmBrush" style="left:${at(zoom.from)}%;width:${((zoom.to - zoom.from) / span * 100).toFixed(3)}%"></div>` : "";
  return `<div class="minimap" id="minimap" style="height:${(n * row + 2).toFixed(0)}px" title="the whole trajectory: drag to zoom into a range, drag the brush to move it">${bars}${brush}</div>`;
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
function hopDetail(t, h) {
  const spanHref = uiLink(spanUi, t.trace_id, h.span_id);
  const dl = [["span ID", `<span class="mono">${esc(h.span_id || "—")}</span>${copyButton(h.span_id, "span ID")}${spanHref ? ` <a class="span-link" href="${esc(spanHref)}" target="_blank" rel="noopener">open the span in the tracing UI</a>` : ""}`], ["hop", esc(h.key)],
    ["started", `${dateTime(h.start)} (+${dur(h.start - t.first_at)} from the first record)`], ["ended", h.end != null ? dateTime(h.end) : "not yet"],
    ["latency", h.impossible ? `<span class="impossible">?</span> ${esc(h.impossible)}` : h.latency_nanos != null ? dur(h.latency_nanos) : "—"],
    ["status", `${h.status}${h.reason ? " — " + esc(h.reason) : ""}`]];
  if (h.group) dl.push(["consumer", `${groupLink(h.group)}/${clientLink(h.consumer)}, attempt ${h.attempt}${h.mode ? ", " + h.mode : ""}${h.by_id ? ", fetched by ID" : ""}`]);
  if (h.arrival_nanos != null) dl.push(["arrival", `${msb(h.arrival_nanos)} ± ${msb(h.arrival_bound_nanos)} after the other side sent it (across the two clocks)`]);
  if (h.on_broker_clock) { const c = h.on_broker_clock; dl.push(["on the broker's clock", `${dateTime(c.start)} → ${c.end != null ? dateTime(c.end) : "not yet"}, ± ${msb(c.bound_nanos)}`]); }
  if (h.clock) dl.push(["clock (this hop)", `${clientLink(h.clock.client)} ${signed(h.clock.offset_nanos)} ± ${msb(h.clock.bound_nanos)} against the broker, round trip ${msb(h.clock.round_trip_nanos)}`]);
  if (h.broker) dl.push(["broker instance", `<span class="mono">${esc(h.broker)}</span>`]);
  if (h.service) dl.push(["service", esc(h.service)]);
  if (h.inferred) dl.push(["note", "times inferred, not measured"]);
  const ev = h.events.map(r => `<li><span class="mono">${dateTime(r.at)}</span> ${esc(describe(r))}</li>`).join("");
  const s = spans && spans.get(h.key);
  const exported = !spans ? `<p class="dim">loading the exported span…</p>`
    : !s ? `<p class="dim">This hop is not exported as a span (yet).</p>`
    : `<div class="dim">span <b>${esc(s.name)}</b> · ${esc(s.kind)} · service ${esc(s.service)}</div>
      <table class="attrs"><thead><tr><th>attribute</th><th>value</th><th><span class="sr">copy</span></th></tr></thead><tbody>${s.attributes.map(([k, v]) =>
        `<tr><td class="mono">${esc(k)}</td><td class="mono">${esc(v)}</td><td>${copyButton(v, k)}</td></tr>`).join("")}</tbody></table>`;
  return `<dl>${dl.map(([k, v]) => `<dt>${k}</dt><dd>${v}</dd>`).join("")}</dl>
    <b>Exported attributes</b>${exported}<b>Events</b><ol class="events">${ev}</ol>`;
}
// A group's heading in the waterfall: its button collapses its hops into one bar (its first
// start to its last end) and expands them again.
function groupRow(t, g, hops, pos, now) {
  const c = collapsed.has(g), from = Math.min(...hops.map(h => h.start)), to = Math.max(...hops.map(h => h.end == null ? now : h.end));
  const st = (t.groups.find(x => x.group === g) || {}).state || "";
  return `<tr class="grp" data-group="${esc(g)}"><td><button type="button" class="collapse" data-group="${esc(g)}" aria-expanded="${!c}" aria-label="${c ? "Expand" : "Collapse"} the hops of group ${esc(g)}"><span aria-hidden="true">${c ? "▸" : "▾"}</span></button>
    group ${groupLink(g)} <span class="dim">${hops.length} hop(s)</span> · <span class="${st}">${st}</span></td><td class="n off">+${dur(from - t.first_at)}</td><td class="n">${c ? dur(to - from) : ""}</td>
    <td>${c ? `<div class="track"><span class="seg-group" data-group-dur="${to - from}" style="left:${pos(from)}%;width:${pos(to) - pos(from)}%"></span></div>` : ""}</td><td></td></tr>`;
}
// ---- zoom ----
// A range inside all of it, `width` wide, around `center` (moved in when it would stick out);
// null when it covers all of it.
function rangeAround(center, width) {
  const f = fullRange;
  if (width >= f.to - f.from) return null;
  let from = center - width / 2;
  from = Math.min(Math.max(from, f.from), f.to - width);
  return { from, to: from + width };
}
// Twice as close (around the open hop when one is open, else the middle), twice as far, or
// all of it.
function setZoom(how) {
  if (!fullRange) return;
  const cur = zoom || fullRange, mid = (cur.from + cur.to) / 2, half = (cur.to - cur.from) / 2;
  if (how === "reset") zoom = null;
  else if (how === "in") {
    const h = openHop && current && current.t && current.t.hops.find(x => x.key === openHop);
    zoom = h ? rangeAround((h.start + (h.end ?? h.start)) / 2, half) : { from: mid - half / 2, to: mid + half / 2 };
  } else if (how === "out") {
    const from = Math.max(fullRange.from, mid - half * 2), to = Math.min(fullRange.to, mid + half * 2);
    zoom = from <= fullRange.from && to >= fullRange.to ? null : { from, to };
  }
  if (current && current.t) render(current.t);
}
// Zooms by `factor` keeping the time at fraction `f` of the axis where it is (the cursor).
function zoomAt(f, factor) {
  if (!fullRange) return;
  const cur = zoom || fullRange, at = cur.from + f * (cur.to - cur.from), width = (cur.to - cur.from) * factor;
  if (width >= fullRange.to - fullRange.from) zoom = null;
  else {
    let from = at - f * width;
    from = Math.min(Math.max(from, fullRange.from), fullRange.to - width);
    zoom = { from, to: from + width };
  }
  if (current && current.t) render(current.t);
}
$("traceBody").addEventListener("wheel", e => {
  const track = e.target.closest("table.wf .track, table.wf .axis"); if (!track || !(e.ctrlKey || e.metaKey)) return;
  e.preventDefault();
  const r = track.getBoundingClientRect();
  zoomAt(Math.min(1, Math.max(0, (e.clientX - r.left) / r.width)), e.deltaY < 0 ? 0.5 : 2);
}, { passive: false });
// Dragging across the bars zooms into the range dragged over; across the minimap, into that
// part of the whole; dragging the minimap's brush moves the range.
let drag = null, dragged = false;
$("traceBody").addEventListener("mousedown", e => {
  if (e.button !== 0) return;
  const mm = e.target.closest("#minimap"), track = e.target.closest("table.wf .track");
  if (!mm && !track) return;
  const r = (mm || track).getBoundingClientRect();
  drag = { left: r.left, width: r.width, x: e.clientX, mini: !!mm, pan: !!e.target.closest("#mmBrush") };
  if (mm) e.preventDefault();
});
window.addEventListener("mouseup", e => {
  if (!drag) return;
  const d = drag; drag = null;
  if (!fullRange) return;
  const full = fullRange, cur = d.mini ? full : (zoom || full), span = cur.to - cur.from;
  const f = x => Math.min(1, Math.max(0, (x - d.left) / d.width));
  if (d.pan && zoom) {
    const shift = (e.clientX - d.x) / d.width * span, w = zoom.to - zoom.from;
    zoom = rangeAround((zoom.from + zoom.to) / 2 + shift, w);
  } else if (Math.abs(e.clientX - d.x) < 4) {
    if (!d.mini || !zoom) return;
    zoom = rangeAround(cur.from + f(e.clientX) * span, zoom.to - zoom.from); // a click on the overview: the range moves there
  } else {
    const a = f(Math.min(d.x, e.clientX)), b = f(Math.max(d.x, e.clientX));
    zoom = { from: cur.from + a * span, to: cur.from + b * span };
  }
  dragged = true; setTimeout(() => { dragged = false; });
  if (current && current.t) render(current.t);
});
// Copies `text`, and says so on the button.
async function copy(button) {
  const text = button.dataset.copy;
  let ok = false;
  try { await navigator.clipboard.writeText(text); ok = true; }
  catch (e) {
    const area = document.createElement("textarea");
    area.value = text; document.body.append(area); area.select();
    try { ok = document.execCommand("copy"); } catch (e2) { ok = false; }
    area.remove();
  }
  button.textContent = ok ? "copied" : "copy failed";
  button.classList.toggle("done", ok);
  setTimeout(() => { button.textContent = "copy"; button.classList.remove("done"); }, 1500);
}
document.addEventListener("click", e => { const b = e.target.closest("button.copy"); if (b) { e.stopPropagation(); copy(b); } }, true);
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
  if (openHop && spansFor !== traceJson) loadSpans(traceJson);
  const again = $("traceBody").querySelector(`tr.hop[data-key="${CSS.escape(tr.dataset.key)}"]`); if (again) again.focus();
});
$("traceBody").addEventListener("keydown", e => {
  if (!e.target.matches("tr.hop[data-key]")) return;
  if (e.key === "Enter" || e.key === " ") { e.preventDefault(); e.target.click(); return; }
  if (e.key === "+" || e.key === "-") {
    // Towards the focused hop.
    e.preventDefault();
    const key = e.target.dataset.key, h = current && current.t && current.t.hops.find(x => x.key === key);
    if (!h || !fullRange) return;
    const cur = zoom || fullRange, w = (cur.to - cur.from) * (e.key === "+" ? 0.5 : 2);
    zoom = rangeAround((h.start + (h.end ?? h.start)) / 2, w);
    render(current.t);
    const again = $("traceBody").querySelector(`tr.hop[data-key="${CSS.escape(key)}"]`); if (again) again.focus();
  }
});
