// The listener page's search and result list (served as /page-list.js after page.js): the
// search form, kept in the address (?topic=orders.*&lookback=1h…, so that reload and a shared
// link keep it); the result list, sortable, one row per message with its end-to-end time as a
// bar; a scatter plot of those times; and a live list that holds still while it is read
// (scrolled down, it says "N new" instead of moving rows under the reader).
"use strict";
const BAD = ["failed", "dead_lettered", "stuck", "lost"];
// The summary's flags: a failure at any hop (even one a later attempt recovered from), a
// redelivery, a dead letter.
const hadFailure = m => !!m.failed || !!m.failure || BAD.includes(m.state) || Object.values(m.groups || {}).some(g => BAD.includes(g));
const rowId = m => m.message_id || m.request_id;
// A message's end to end: its slowest group's (what min_ms searches), or else how long its
// records span so far.
function e2eOf(m) {
  const e = (m.segments || []).filter(s => s[0] === "end_to_end").map(s => s[1]);
  return e.length ? Math.max(...e) : null;
}
const durationOf = m => e2eOf(m) ?? Math.max(0, m.last_at - m.first_at);
const SORTS = {
  recent: (a, b) => b.first_at - a.first_at,
  oldest: (a, b) => a.first_at - b.first_at,
  longest: (a, b) => durationOf(b) - durationOf(a),
  shortest: (a, b) => durationOf(a) - durationOf(b),
  groups: (a, b) => Object.keys(b.groups || {}).length - Object.keys(a.groups || {}).length,
  problems: (a, b) => (hadFailure(b) - hadFailure(a)) || b.first_at - a.first_at,
};
const LOOKBACK = { "5m": 300, "1h": 3600, "24h": 86400 };
const TEXT_FIELDS = ["topic", "producer", "group", "attr", "state", "min_ms", "max_ms", "limit", "sort", "lookback"];
const FLAGS = ["failed", "redelivered", "dead_letter"];
const DEFAULTS = { limit: "50", sort: "recent" };

// ---- the search form and the address ----
function setSearchError(msg, field) {
  $("serr").textContent = msg || "";
  for (const n of ["from", "to"]) $("f-" + n).removeAttribute("aria-invalid");
  if (field) $("f-" + field).setAttribute("aria-invalid", "true");
}
// The form's From/To as Unix milliseconds (null: empty; NaN: not a time).
function formTimes() {
  const f = $("search").elements, out = {};
  for (const n of ["from", "to"]) out[n] = f[n].value.trim() ? parseStamp(f[n].value) : null;
  return out;
}
// The form as the address's query string: From/To as UTC instants, so that the link means
// the same time whatever zone the reader's page shows.
function formToUrl() {
  const f = $("search").elements, q = new URLSearchParams();
  for (const n of TEXT_FIELDS) { const v = f[n].value.trim(); if (v && v !== DEFAULTS[n]) q.set(n, v); }
  const t = formTimes();
  for (const n of ["from", "to"]) if (Number.isFinite(t[n])) q.set(n, new Date(t[n]).toISOString());
  for (const n of FLAGS) if (f[n].checked) q.set(n, "true");
  const s = q.toString();
  history.replaceState(history.state, "", location.pathname + (s ? "?" + s : "") + location.hash);
}
function urlToForm() {
  const f = $("search").elements, q = new URLSearchParams(location.search);
  for (const n of TEXT_FIELDS) f[n].value = q.get(n) || DEFAULTS[n] || "";
  for (const n of ["from", "to"]) { const v = Date.parse(q.get(n) || ""); f[n].value = Number.isFinite(v) ? stamp(v).slice(0, 19) : ""; }
  for (const n of FLAGS) f[n].checked = q.get(n) === "true";
}
// "Times in" switched from `was` to the page's zone: From/To keep the instants they meant.
function retimeForm(was) {
  const f = $("search").elements;
  for (const n of ["from", "to"]) {
    const v = parseStamp(f[n].value, was);
    if (Number.isFinite(v)) f[n].value = stamp(v).slice(0, 19);
  }
  markZones();
}
function markZones() { for (const z of document.querySelectorAll(".zone")) z.textContent = zoneName(); }
// The API query of the form, or null (and the error said) when From/To is not a time.
function searchQuery() {
  const f = $("search").elements, q = new URLSearchParams();
  for (const n of ["topic", "producer", "group", "attr", "state", "min_ms", "limit"]) {
    const v = f[n].value.trim(); if (v) q.set(n, v);
  }
  const t = formTimes();
  for (const n of ["from", "to"]) {
    if (Number.isNaN(t[n])) { setSearchError(`${n === "from" ? "From" : "To"}: write a time as 2026-12-02 05:00:00 (24-hour, ${zoneName()})`, n); return null; }
    if (t[n] != null) q.set(n, (BigInt(Math.round(t[n])) * 1000000n).toString());
  }
  if (t.from == null && LOOKBACK[f.lookback.value]) q.set("since_secs", LOOKBACK[f.lookback.value]);
  for (const n of FLAGS) if (f[n].checked) q.set(n, "true");
  setSearchError("");
  return q.toString();
}
// Runs a search of exactly these fields (the others cleared) and shows its result list.
function searchFor(fields) {
  const f = $("search").elements;
  for (const n of [...TEXT_FIELDS, "from", "to"]) f[n].value = DEFAULTS[n] || "";
  for (const n of FLAGS) f[n].checked = false;
  for (const [k, v] of Object.entries(fields)) $("search").elements[k].value = v;
  formToUrl();
  loadList(true);
  $("results").scrollIntoView({ block: "start" });
}

// ---- the list: live, sorted, drawn in chunks, its selection kept across refreshes ----
let listJson = "", selectedKey = null, held = null;
async function loadList(force) {
  const q = searchQuery();
  if (q == null) return;
  let list;
  try { list = await api("/api/messages?" + q); }
  catch (err) {
    if (!err.network) { listJson = ""; held = null; listRows = []; $("list").innerHTML = `<tr><td class="error">${esc(err.message)}</td></tr>`; $("count").textContent = ""; drawScatter([]); }
    return;
  }
  const maxMs = parseFloat($("f-max").value);
  if (Number.isFinite(maxMs)) list = list.filter(m => durationOf(m) <= maxMs * 1e6);
  const json = JSON.stringify(list);
  if (json === listJson && !force) { held = null; showHeld(); return; } // nothing new: the list stays as it is
  // Scrolled down (reading): the rows stay where they are; "N new" says what waits.
  if (!force && $("listwrap").scrollTop > 2 && listRows.length) { held = { list, json }; showHeld(); return; }
  held = null; showHeld();
  listJson = json;
  renderList(list);
}
function showHeld() {
  const b = $("newRows");
  if (!held) { b.hidden = true; return; }
  const known = new Set(listRows.map(m => m.key)), fresh = held.list.filter(m => !known.has(m.key)).length;
  b.hidden = false;
  b.textContent = fresh ? `${fresh} new — show` : "updated — show";
  if (b.dataset.n !== String(fresh)) { b.dataset.n = String(fresh); if (fresh) announce(`${fresh} new messages; the list holds still while you read it`); }
}
function applyHeld() {
  if (!held) return;
  const h = held; held = null; showHeld();
  listJson = h.json; renderList(h.list);
  $("listwrap").scrollTop = 0;
}
// Rows are drawn 500 at a time (one string, one insertion), more as the list scrolls or the
// keyboard reaches the end, so 10 000 listed messages stay fast.
const CHUNK = 500;
let listRows = [], drawn = 0, longest = 1;
const today = () => stamp(Date.now()).slice(0, 10);
// An observed message's ID is a UUIDv8 (docs/PROTOCOL.md, "Observed messages"); a broker's
// is a UUIDv7.
const isObserved = id => !!id && id[14] === "8";
function rowHtml(m) {
  const id = rowId(m), failed = hadFailure(m) && !BAD.includes(m.state);
  const at = dateTime(m.first_at, false), d = durationOf(m), done = e2eOf(m) != null;
  const groups = Object.entries(m.groups || {});
  const tail = m.message_id ? "…" + m.message_id.slice(-12) : "request " + m.request_id;
  return `<tr class="msg" tabindex="-1" data-key="${esc(m.key)}" data-id="${esc(id)}" data-producer="${esc(m.message_id ? "" : m.producer)}" aria-selected="false">
    <td class="t" title="${esc(at)}">${at.slice(0, 10) === today() ? at.slice(11) : at}</td>
    <td>${esc(m.topic)}${isObserved(m.message_id) ? ` <span class="badge obs" title="observed: traced from nats-server's events about stream ${esc(m.producer)}">observed</span>` : ""}<div class="dim sub"><span class="mono" title="${esc(id)}">${esc(tail)}</span> · <span class="prod" title="${isObserved(m.message_id) ? "stream" : "producer"}">${esc(m.producer)}</span></div></td>
    <td class="n" title="${esc(groups.map(([g, s]) => g + ": " + s).join(", ") || "no group got it yet")}${m.attempts != null ? esc(`; ${m.attempts} delivery attempts`) : ""}">${groups.length}${m.attempts != null ? `<div class="dim sub attempts">${m.attempts} att.</div>` : ""}</td>
    <td class="dur" data-nanos="${d}"><span class="${done ? "" : "incomplete"}" title="${done ? "end to end, its slowest group" : "its records so far: no group has consumed it"}">${dur(d)}</span><div class="mini"><i style="width:${(d / longest * 100).toFixed(1)}%"></i></div></td>
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
const COLUMNS = [["first seen", "recent", "oldest"], ["topic, ID · producer"], ["groups · attempts", "groups"], ["end to end", "longest", "shortest"], ["state", "problems"]];
function renderList(list) {
  const table = $("list"), hadFocus = table.contains(document.activeElement);
  const focusedKey = hadFocus ? document.activeElement.dataset.key : null;
  const sort = $("f-sort").value;
  listRows = SORTS[sort] && sort !== "recent" ? [...list].sort(SORTS[sort]) : list;
  drawn = 0;
  longest = Math.max(1, ...list.map(durationOf));
  const head = COLUMNS.map(([name, one, other], i) => {
    const on = sort === one || sort === other, cls = i === 2 || i === 3 ? ' class="n"' : "";
    const label = i === 0 ? `${name} (${zoneName()})` : name;
    return `<th${cls}${one ? ` data-sort="${one}"${other ? ` data-sort2="${other}"` : ""} aria-sort="${on ? (sort === "oldest" || sort === "shortest" ? "ascending" : "descending") : "none"}" title="sort by ${name}"` : ""}>${label}${on ? (sort === "oldest" || sort === "shortest" ? " ▴" : " ▾") : ""}</th>`;
  }).join("");
  table.innerHTML = `<thead><tr>${head}</tr></thead><tbody></tbody>`;
  // Down to the focused or open row, at least.
  const want = listRows.findIndex(m => m.key === (focusedKey || selectedKey));
  drawMore(want + 1);
  markSelected();
  // After the rows: the list is usable first.
  clearTimeout(scatterTimer); scatterTimer = setTimeout(() => drawScatter(list));
  const keep = focusedKey && table.querySelector(`tr.msg[data-key="${CSS.escape(focusedKey)}"]`);
  if (keep) { keep.tabIndex = 0; keep.focus({ preventScroll: true }); }
  else if (!table.querySelector('tr.msg[tabindex="0"]') && table.querySelector("tr.msg")) table.querySelector("tr.msg").tabIndex = 0;
}
// A click on a column heading sorts by it (again: the other way); the form's Sort says so.
$("list").addEventListener("click", e => {
  const th = e.target.closest("th[data-sort]"); if (!th) return;
  const s = $("f-sort");
  s.value = s.value === th.dataset.sort && th.dataset.sort2 ? th.dataset.sort2 : th.dataset.sort;
  formToUrl(); listJson = ""; renderList([...listRows]);
});
$("listwrap").addEventListener("scroll", e => {
  const w = e.target;
  if (w.scrollTop + w.clientHeight > w.scrollHeight - 300) drawMore();
  if (w.scrollTop <= 2 && held) applyHeld(); // back at the top: the new rows come in
});
$("newRows").addEventListener("click", applyHeld);
function markSelected() {
  for (const tr of $("list").querySelectorAll('tr.msg[aria-selected="true"]')) tr.setAttribute("aria-selected", "false");
  for (const c of document.querySelectorAll('#scatter circle.on')) c.classList.remove("on");
  if (!current) return;
  const key = selectedKey, id = current.id;
  for (const tr of $("list").querySelectorAll("tr.msg")) {
    if ((key && tr.dataset.key === key) || (!key && tr.dataset.id === id)) {
      tr.setAttribute("aria-selected", "true");
      for (const o of $("list").querySelectorAll('tr.msg[tabindex="0"]')) o.tabIndex = -1;
      tr.tabIndex = 0;
      const c = document.querySelector(`#scatter circle[data-key="${CSS.escape(tr.dataset.key)}"]`);
      if (c) c.classList.add("on");
      break;
    }
  }
}
// Opens a row's trajectory, and brings it into view when the layout put it out of sight.
function openRow(tr) {
  trace(tr.dataset.id, tr.dataset.producer, { key: tr.dataset.key, reveal: true });
}
// Brings the trajectory into view when it is out of sight (the list above it, below 1200 px).
function revealTrace() {
  const r = $("trace").getBoundingClientRect();
  if (r.top < 0 || r.top > window.innerHeight * 0.5) $("trace").scrollIntoView({ block: "start" });
}
$("list").addEventListener("click", e => { const tr = e.target.closest("tr.msg"); if (tr) { tr.focus({ preventScroll: true }); openRow(tr); } });
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
$("search").addEventListener("submit", e => { e.preventDefault(); formToUrl(); loadList(true); });
$("search").addEventListener("reset", () => setTimeout(() => { setSearchError(""); formToUrl(); loadList(true); }));
for (const id of ["state", "f-sort", "f-lookback"]) $(id).addEventListener("change", () => { formToUrl(); loadList(true); });

// ---- the scatter plot: each listed message's end to end over when it was first seen ----
let scatterTimer = null;
// Up to 2 000 dots (the first of the list's order), each with its words as a tooltip up to
// 500 of them.
function drawScatter(list) {
  const svg = $("scatter"), w = Math.max(svg.clientWidth, 100), h = 84, pad = 6;
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  if (!list.length) { svg.innerHTML = ""; $("scatterNote").textContent = ""; return; }
  const t0 = Math.min(...list.map(m => m.first_at)), t1 = Math.max(...list.map(m => m.first_at));
  const top = Math.max(1, ...list.map(durationOf));
  const x = m => pad + (t1 > t0 ? (m.first_at - t0) / (t1 - t0) : 0.5) * (w - 2 * pad);
  const y = m => h - pad - durationOf(m) / top * (h - 2 * pad);
  svg.innerHTML = `<line x1="${pad}" y1="${h - pad}" x2="${w - pad}" y2="${h - pad}" class="ax"/>` + list.slice(0, 2000).map(m =>
    `<circle cx="${x(m).toFixed(1)}" cy="${y(m).toFixed(1)}" r="3.5" class="pt ${m.state}" data-key="${esc(m.key)}" data-id="${esc(rowId(m))}" data-producer="${esc(m.message_id ? "" : m.producer)}" data-nanos="${durationOf(m)}">${list.length <= 500 ? `<title>${esc(m.topic)} · ${dur(durationOf(m))} · ${m.state} · ${dateTime(m.first_at)}</title>` : ""}</circle>`).join("");
  $("scatterNote").textContent = `end to end, 0 – ${dur(top)}, over ${dateTime(t0, false).slice(11)} – ${dateTime(t1, false).slice(11)}`;
  markSelected();
}
$("scatter").addEventListener("click", e => {
  const c = e.target.closest("circle.pt"); if (!c) return;
  selectedKey = c.dataset.key;
  openRow(c);
});
