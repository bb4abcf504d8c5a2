// The listener page's views beside a trajectory (served as /page-views.js after the other
// scripts, whose helpers it uses): consumer groups, one group, dead letters, a client's events.
"use strict";
// ---- views beside a trajectory: consumer groups, one group, dead letters, a client's events ----
// Addressed as #/groups, #/groups/<group>, #/dead-letters, #/clients/<client>.
let view = null, viewJson = "", viewSeq = 0;
function showView(kind, arg) {
  view = { kind, arg }; viewJson = "";
  current = null; clearTimeout(followTimer); traceSeq++; markSelected();
  $("trace").hidden = true; $("view").hidden = false; $("viewBody").textContent = "loading…";
  markNav(); drawView();
}
function hideView() { if (!view) return; view = null; $("view").hidden = true; $("trace").hidden = false; markNav(); }
function markNav() {
  for (const [id, kind] of [["nav-groups", "groups"], ["nav-dead", "dead"], ["nav-observe", "observe"]]) {
    if (view && view.kind === kind) $(id).setAttribute("aria-current", "page"); else $(id).removeAttribute("aria-current");
  }
}
const VIEWS = {
  groups: { title: () => "Consumer groups", path: () => "/api/groups", draw: groupsHtml },
  group: { title: g => `Consumer group ${g}`, path: g => "/api/groups/" + enc(g), draw: groupHtml },
  dead: { title: () => "Dead letters", path: () => "/api/dead-letters", draw: deadHtml },
  client: { title: c => `Client ${c}`, load: clientData, draw: clientHtml },
  observe: { title: () => "Observed streams", load: observeData, draw: observeHtml },
};
// A client's events, its clock offsets (as `msgtrail trace --client` gives them), and whether
// it produced any listed message: one body for its view.
// Its groups: those its events name, and those whose members (GET /api/groups/{g}) hold it.
async function clientData(c) {
  const [ev, clocks, produced, all] = await Promise.all([api("/api/clients/" + enc(c) + "/events"),
    api("/api/clients/" + enc(c)), api("/api/messages?limit=1&producer=" + enc(c)), api("/api/groups")]);
  const details = await Promise.all(all.groups.slice(0, 50).map(g => api("/api/groups/" + enc(g.group)).catch(() => null)));
  const groups = new Set(ev.events.map(r => r.group).filter(Boolean));
  details.forEach((d, i) => { if (d && d.members.some(m => m.consumer === c)) groups.add(all.groups[i].group); });
  return { ...ev, clocks: clocks.clocks, window_secs: clocks.window_secs, produced: produced.length > 0, groups: [...groups].filter(Boolean).sort() };
}
async function drawView() {
  if (!view) return;
  const v = VIEWS[view.kind], arg = view.arg, seq = ++viewSeq;
  $("viewTitle").textContent = v.title(arg);
  let body;
  try { body = await (v.load ? v.load(arg) : api(v.path(arg))); }
  catch (err) {
    if (seq !== viewSeq || err.network) return;
    viewJson = "";
    $("viewBody").innerHTML = err.status === 404 ? `<b>Not found</b>: ${esc(err.message)}` : `<b class="error">Query failed</b>: ${esc(err.message)}`;
    return;
  }
  const json = JSON.stringify(body);
  if (seq !== viewSeq || json === viewJson) return; // unchanged: the view stays under the cursor
  viewJson = json;
  $("viewBody").className = "";
  $("viewBody").innerHTML = v.draw(body, arg);
}
const num = (n, label, title = "") => `<div data-n="${n[0]}" title="${esc(title)}"><b>${n[1]}</b>${label}</div>`;
function groupsHtml(o) {
  const rows = o.groups.map(g => `<tr class="group" data-group="${esc(g.group)}"><td>${groupLink(g.group)}</td><td class="n">${g.messages}</td><td class="n">${g.in_flight}</td>
    <td class="n">${g.backlog}</td><td class="n">${g.consumed}</td><td class="n">${g.ack_rate_per_sec.toFixed(2)}/s</td><td class="n">${g.dead_letters}</td><td>${[...g.topics].map(esc).join(" ")}</td></tr>`).join("");
  return `<p class="dim">Messages first seen since ${dateTime(o.from)}${o.truncated ? ` (the newest ${o.scanned} only)` : ""}; a group appears once it got a delivery.</p>
    ${rows ? `<table id="groups"><thead><tr><th>group</th><th class="n">messages</th><th class="n">in flight</th><th class="n">backlog</th><th class="n">consumed</th><th class="n">ack rate</th><th class="n">dead letters</th><th>topics</th></tr></thead><tbody>${rows}</tbody></table>` : "<p>No group got a message in this window.</p>"}`;
}
function groupHtml(d, name) {
  const c = d.counts;
  const states = STATES.filter(k => c.states[k]).map(k => `<span class="${k}">${k} ${c.states[k]}</span>`).join(" · ");
  const members = d.members.map(m => `<tr><td>${clientLink(m.consumer)}</td><td class="n">${m.deliveries}</td><td>${dateTime(m.last_seen)}</td></tr>`).join("");
  const segs = d.segments.map(p => `<tr data-segment="${p.segment}"><td>${p.segment.replace(/_/g, " ")}</td><td class="n">${p.count}</td><td class="n">${p.p50_ms.toFixed(2)} ms</td><td class="n">${p.p99_ms.toFixed(2)} ms</td><td class="n">${p.max_ms.toFixed(2)} ms</td></tr>`).join("");
  return `<div class="nums">${num(["messages", c.messages], "messages")}${num(["in_flight", c.in_flight], "in flight", "delivered, not settled")}
    ${num(["backlog", c.backlog], "backlog", "not settled, or not delivered yet as far as the listener knows")}${num(["not_delivered", c.not_delivered], "not delivered yet")}
    ${num(["consumed", c.consumed], "consumed")}${num(["ack_rate", c.ack_rate_per_sec.toFixed(2) + "/s"], "ack rate")}
    ${num(["redeliveries", d.redeliveries], "redeliveries", `in its newest ${d.sample} messages`)}${num(["dead_letters", c.dead_letters], "dead letters")}</div>
    <div>${states}</div><p class="dim">Topics ${[...c.topics].map(esc).join(", ")}. Members, redeliveries and latencies: its newest ${d.sample} message(s).
    <a href="#" class="link" data-list-group="${esc(name)}">List its messages</a></p>
    <h3>Members</h3>${members ? `<table id="members"><tr><th>consumer</th><th class="n">deliveries</th><th>last seen</th></tr>${members}</table>` : "<p class='dim'>none seen</p>"}
    <h3>Latency per hop segment</h3>${segs ? `<table id="segments"><tr><th>segment</th><th class="n">samples</th><th class="n">p50</th><th class="n">p99</th><th class="n">max</th></tr>${segs}</table>` : "<p class='dim'>no sample yet</p>"}`;
}
function deadHtml(list) {
  const rows = list.map(d => {
    const id = d.message_id || d.request_id || d.key;
    return `<tr class="dl" data-id="${esc(id)}"><td class="t">${dateTime(d.at)}</td><td>${esc(d.topic)}</td><td>${groupLink(d.group)}</td>
      <td>${clientLink(d.consumer)}${d.attempt ? ` #${d.attempt}` : ""}</td><td>${esc(d.reason || "—")}${d.last_error ? `<div class="dim">last error: ${esc(d.last_error)}</div>` : ""}</td>
      <td><a class="link mono open" href="#${esc(enc(id))}" title="${esc(id)}">${esc(String(id).slice(0, 18))}…</a></td></tr>`;
  }).join("");
  return rows ? `<table id="dead"><thead><tr><th>dead-lettered</th><th>topic</th><th>group</th><th>consumer, attempt</th><th>why</th><th>message</th></tr></thead><tbody>${rows}</tbody></table>`
    : "<p>No dead-lettered message.</p>";
}
function clientHtml(c, id) {
  const rows = c.events.map(r => `<tr class="ev"><td class="t">${dateTime(r.at)}</td><td>${esc(describe(r))}</td>
    <td>${r.group ? "group " + groupLink(r.group) : ""}${r.topic ? " topic " + esc(r.topic) : ""}</td></tr>`).join("");
  // A consumer's messages are its groups' (a search by producer would find none of them).
  const groups = c.groups || [];
  const lists = [...groups.map(g => `<a href="#" class="link" data-list-group="${esc(g)}">List the messages of its group ${esc(g)}</a>`),
    ...(c.produced || !groups.length ? [`<a href="#" class="link" data-list-producer="${esc(id)}">List the messages it produced</a>`] : [])].join(" · ");
  const clocks = (c.clocks || []).map(w => `<tr><td>${w.broker ? "vs broker " + esc(w.broker) : "broker (unnamed)"}</td><td>${signed(w.offset_nanos)} ± ${msb(w.bound_nanos)}</td>
    <td>round trip ${msb(w.round_trip_nanos)}</td><td>${w.samples} exchange(s)</td><td>measured ${dateTime(w.measured_at)}</td></tr>`).join("");
  return `<p class="dim">Its channel events (A1) and no-match notices (N1), newest first. ${lists}</p>
    <h3>Clock against the broker's</h3>${clocks ? `<table id="clientClocks">${clocks}</table>` : `<p class="dim" id="clientClocks">No exchange of this client in the last ${c.window_secs || 60} s of records: no clock estimate.</p>`}
    <h3>Events</h3>${rows ? `<table id="events">${rows}</table>` : "<p>No channel event or no-match notice of this client.</p>"}`;
}
// Observe mode's status (GET /api/observe) and its statistics (GET /api/stats, `observed`):
// one body for its view, the statistics by stream.
async function observeData() {
  const [o, stats] = await Promise.all([api("/api/observe"), api("/api/stats").catch(() => null)]);
  const figures = {};
  for (const s of (stats && stats.observed) || []) figures[s.stream] = s;
  return { ...o, figures, window_secs: stats ? stats.window_secs : null };
}
// One stream's statistics: its counts, then per consumer what nats-server showed of its
// deliveries and what it holds now.
function observedFiguresHtml(f, windowSecs) {
  if (!f) return "";
  const pct = l => l.count ? `<span title="max ${l.max_ms.toFixed(2)} ms, ${l.count} sample(s)">${l.p50_ms.toFixed(1)} / ${l.p99_ms.toFixed(1)} ms</span>` : "—";
  const rows = (f.consumers || []).map(c => {
    const now = c.now || {};
    const terms = Object.entries(c.term_reasons || {}).map(([r, n]) => `${r || "no reason"}: ${n}`).join(", ");
    return `<tr class="figures" data-figures="${esc(c.consumer)}"><td>${groupLink(c.consumer)}</td><td class="n" data-k="deliveries">${c.deliveries}</td>
      <td class="n" data-k="redeliveries">${c.redeliveries}</td><td class="n" data-k="acks">${c.acks}</td><td class="n" data-k="naks">${c.naks}</td>
      <td class="n" data-k="terms" title="${esc(terms)}">${c.terms}</td><td class="n" data-k="max_deliveries">${c.max_deliveries}</td>
      <td class="n" data-k="unacked">${now.unacked ?? "—"}</td><td class="n" data-k="pending">${now.pending ?? "—"}</td>
      <td class="n" data-k="queue_wait">${pct(c.queue_wait.window)}</td><td class="n" data-k="ack_time">${pct(c.ack_time.window)}</td></tr>`;
  }).join("");
  const nums = `<div class="nums">${num(["stored", f.stored], "stored")}${num(["stuck", f.stuck], "stuck", "stored, no consumer's delivery seen within the listener's delivered deadline")}${num(["unacked", f.unacked], "unacked", "delivered and not acknowledged, over its consumers (consumer info)")}</div>`;
  return nums + (rows ? `<div class="scroll"><table class="stats"><thead><tr><th>consumer</th><th class="n">deliveries</th><th class="n" title="attempts after the first">redeliv.</th><th class="n">acks</th><th class="n">naks</th><th class="n">terms</th><th class="n" title="max deliveries reached">max dlv</th>
    <th class="n" title="delivered, not acknowledged (consumer info)">unacked</th><th class="n" title="stored, not delivered yet (consumer info)">pending</th><th class="n" title="stored → first delivery">queue wait p50/p99</th><th class="n" title="delivery → ack">ack time p50/p99</th></tr></thead><tbody>${rows}</tbody></table></div>
    <p class="dim">Queue wait (stored → first delivery) and ack time (delivery → ack) over the last ${windowSecs} s (the maximum and the samples on hover); unacked and pending as nats-server's consumer info said at the last look.</p>` : "");
}
// Per observed stream whether it exists and is read, its statistics, its durable consumers,
// and those that do not sample every ack, with the fix.
function observeHtml(o) {
  const streams = Object.entries(o.streams || {}).map(([name, s]) => {
    const rows = Object.entries(s.consumers || {}).map(([c, v]) => `<tr class="consumer${v.every_ack_sampled ? "" : " unsampled"}" data-consumer="${esc(c)}"><td>${groupLink(c)}</td><td>${esc(v.mode)}</td>
      <td>${esc((v.filter_subjects || []).join(" ") || "all")}</td><td class="n">${v.sample_freq} %</td>
      <td>${v.every_ack_sampled ? `<span class="ok">every ack sampled</span>` : `<span class="error">⚠ acked deliveries missing</span><div>Fix: <code class="fix">${esc(v.fix)}</code>${copyButton(v.fix, "command")}</div>`}</td></tr>`).join("");
    const state = !s.exists ? `<span class="incomplete">not there yet (picked up when it appears)</span>`
      : s.reads_messages ? `<span class="ok">exists; its stored messages are read</span>`
      : `<span class="incomplete">exists; its stored messages are not read (a work-queue stream, or refused): no store hops</span>`;
    return `<div class="stream" data-stream="${esc(name)}"><h3>${esc(name)}</h3><p>${state}</p>${observedFiguresHtml((o.figures || {})[name], o.window_secs)}${rows
      ? `<table class="consumers"><thead><tr><th>consumer</th><th>mode</th><th>filter</th><th class="n">sample_freq</th><th>acks</th></tr></thead><tbody>${rows}</tbody></table>`
      : `<p class="dim">No durable consumer yet.</p>`}</div>`;
  }).join("");
  return `<p class="dim">Observe mode traces these JetStream streams from nats-server's own events. A consumer under 100 % sample_freq reports only some acks (none at 0 %): start the listener with --observe-set-sample-freq, or run each fix.</p>${streams}`;
}
// The header's link to the observed streams: shown when the listener observes (its count of
// consumers that do not sample every ack beside it).
let observing = true;
async function loadObserveNav() {
  if (!observing) return;
  let o;
  try { o = await api("/api/observe"); } catch (e) { if (e.status === 404) { observing = false; $("nav-observe").hidden = true; } return; }
  const bad = Object.values(o.streams || {}).reduce((n, s) => n + Object.values(s.consumers || {}).filter(c => !c.every_ack_sampled).length, 0);
  $("nav-observe").hidden = false;
  $("nav-observe").textContent = "Observed streams" + (bad ? ` ⚠ ${bad} unsampled` : "");
  $("nav-observe").title = bad ? `${bad} consumer(s) do not sample every ack: their hops may be missing` : "every consumer samples every ack";
}
$("viewBody").addEventListener("click", e => {
  const a = e.target.closest("a[data-list-group], a[data-list-producer]"); if (!a) return;
  e.preventDefault();
  searchFor(a.dataset.listGroup ? { group: a.dataset.listGroup } : { producer: a.dataset.listProducer });
});

