// The listener page's core (served as /page.js, the first of its scripts): the API with its
// bearer token and its banner, times and durations in words, the statistics bar.
// page-list.js (the search and the result list), page-trace.js (a trajectory's waterfall)
// and page-views.js (groups, dead letters, a client) build on it; page.html wires them.
"use strict";
const STATES = ["sent","enqueued","delivered","consuming","consumed","failed","dead_lettered","stuck","lost"];
const SETTLED = ["consumed", "dead_lettered", "lost"];
const REFRESH_MS = 5000, FOLLOW_MS = 2000;
const $ = id => document.getElementById(id);
const esc = s => String(s ?? "").replace(/[&<>"']/g, c => ({"&":"&amp;","<":"&lt;",">":"&gt;","\"":"&quot;","'":"&#39;"}[c]));
const enc = encodeURIComponent;
// Never rounds up to 100 % (246 of 247 reads 99.5 %, not 100 %) nor down to 0 %.
function pct(a, b) {
  if (!b) return "";
  if (a === b) return " (100%)";
  const p = Math.floor(a * 1000 / b) / 10;
  return ` (${a > 0 && p === 0 ? "<0.1" : p}%)`;
}
// A duration (nanoseconds) in the unit its magnitude asks for: 830 ns, 41.2 µs, 3.27 ms,
// 1.350 s, 2 min 5.0 s.
function dur(n) {
  const a = Math.abs(n), s = n < 0 ? "−" : "";
  if (a < 1e3) return s + Math.round(a) + " ns";
  if (a < 1e6) return s + (a / 1e3).toFixed(a < 1e4 ? 2 : a < 1e5 ? 1 : 0) + " µs";
  if (a < 1e9) return s + (a / 1e6).toFixed(a < 1e7 ? 2 : a < 1e8 ? 1 : 0) + " ms";
  if (a < 60e9) return s + (a / 1e9).toFixed(a < 1e10 ? 3 : 2) + " s";
  const m = Math.floor(a / 60e9);
  return s + `${m} min ${((a - m * 60e9) / 1e9).toFixed(1)} s`;
}
// Clock bounds, often below a millisecond: three decimals there.
const ms = n => { const v = n / 1e6; return v >= 1000 ? (v/1000).toFixed(2) + " s" : v >= 10 ? v.toFixed(0) + " ms" : v.toFixed(1) + " ms"; };
const msb = n => Math.abs(n) < 1e6 ? (n / 1e6).toFixed(3) + " ms" : ms(n);
const signed = n => (n >= 0 ? "+" : "−") + msb(Math.abs(n));

// ---- the bearer token: from ?token= once (then gone from the address bar), or typed in ----
const TOKEN_KEY = "msgtrail-token";
let token = (() => {
  const u = new URL(location.href), given = u.searchParams.get("token");
  if (given == null) return localStorage.getItem(TOKEN_KEY);
  localStorage.setItem(TOKEN_KEY, given);
  u.searchParams.delete("token");
  history.replaceState(history.state, "", u.pathname + u.search + u.hash);
  return given;
})();
function askToken(refused) {
  $("tokenBox").hidden = false;
  $("tokenWhy").textContent = refused
    ? "This listener refused the token this page has. Paste the right one:"
    : "This listener needs a bearer token (the one it was started with: msgtrail listener --token, or MSGTRAIL_LISTENER_TOKEN). Paste it here, or open the page as /?token=…:";
}
function useToken(t) {
  token = t.trim() || null;
  if (token) localStorage.setItem(TOKEN_KEY, token); else localStorage.removeItem(TOKEN_KEY);
  $("tokenBox").hidden = true;
}

// ---- times: exact nanoseconds, a date and an explicit zone (UTC or local) ----
// The API's times are Unix nanoseconds, beyond a double's exact integers (2^53 ns is 104
// days): read from the JSON text itself (JSON.parse's source text), each is kept as
// nanoseconds since EPOCH (the page's start), exact within 104 days of it, so that offsets
// and durations computed on the page are exact to the nanosecond.
const EPOCH_MS = (() => {
  let exact = false;
  JSON.parse("1", (k, v, ctx) => { exact = !!(ctx && "source" in ctx); return v; });
  return exact ? Date.now() : 0;
})();
const EPOCH = BigInt(EPOCH_MS) * 1000000n;
const reviveTime = (k, v, ctx) => typeof v === "number" && !Number.isSafeInteger(v) && ctx && /^-?\d+$/.test(ctx.source) ? Number(BigInt(ctx.source) - EPOCH) : v;
// Now, in the page's nanoseconds.
const nowNanos = () => (Date.now() - EPOCH_MS) * 1e6;
// The text each API answer was parsed from (for the JSON download).
const rawOf = new WeakMap();
let tz = localStorage.getItem("msgtrail-tz") === "local" ? "local" : "utc";
const p2 = (x, w = 2) => String(x).padStart(w, "0");
function zoneName(z = tz) {
  if (z === "utc") return "UTC";
  const off = -new Date().getTimezoneOffset(), a = Math.abs(off);
  return `UTC${off >= 0 ? "+" : "-"}${p2(Math.floor(a / 60))}:${p2(a % 60)}`;
}
// Unix milliseconds as the page writes times: 2026-12-02 05:00:00.000, 24-hour, in `z`.
function stamp(msec, z = tz) {
  const d = new Date(msec);
  return z === "utc" ? d.toISOString().slice(0, 23).replace("T", " ")
    : `${d.getFullYear()}-${p2(d.getMonth() + 1)}-${p2(d.getDate())} ${p2(d.getHours())}:${p2(d.getMinutes())}:${p2(d.getSeconds())}.${p2(d.getMilliseconds(), 3)}`;
}
function dateTime(n, zone = true) {
  const s = stamp(EPOCH_MS + n / 1e6);
  return zone ? s + " " + zoneName() : s;
}
// A time the user typed in the page's format (2026-12-02 05:00[:00[.000]], a "T" also
// taken) read in zone `z`: Unix milliseconds, or NaN.
function parseStamp(v, z = tz) {
  const m = /^\s*(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2})(?::(\d{2})(?:\.(\d{1,3}))?)?\s*$/.exec(v || "");
  if (!m) return NaN;
  const [y, mo, d, h, mi, s, f] = m.slice(1).map((x, i) => i === 6 ? Number((x || "0").padEnd(3, "0")) : Number(x || 0));
  if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || s > 59) return NaN;
  return z === "utc" ? Date.UTC(y, mo - 1, d, h, mi, s, f) : new Date(y, mo - 1, d, h, mi, s, f).getTime();
}

// ---- the API, and the banner when the listener cannot be reached ----
let lastGood = null, paused = false;
// An API error's words without the API's kind prefix ("bad query: …").
const plain = m => String(m || "").replace(/^(bad query|not found): /, "");
async function api(path) {
  let r;
  try {
    r = await fetch(path, { cache: "no-store", headers: token ? { Authorization: "Bearer " + token } : {} });
  } catch (e) {
    listenerDown(e);
    throw Object.assign(new Error("the listener cannot be reached"), { network: true });
  }
  listenerUp();
  const text = await r.text().catch(() => "");
  let body;
  try { body = JSON.parse(text, reviveTime); } catch (e) { body = { error: r.statusText }; }
  if (body && typeof body === "object") rawOf.set(body, text);
  if (r.status === 401) askToken(!!token);
  if (!r.ok) throw Object.assign(new Error(plain(body.error) || r.statusText), { status: r.status, body });
  return body;
}
function listenerDown(e) {
  $("banner").title = e.message;
  $("bannerText").textContent = "The listener cannot be reached. " +
    (lastGood ? `Showing the data as of ${dateTime(lastGood)}; ` : "") + `retrying every ${REFRESH_MS / 1000} s.`;
  $("banner").hidden = false;
}
function listenerUp() { lastGood = nowNanos(); $("banner").hidden = true; }
// Says `text` once to a screen reader (the one live region: the rest redraws every 2 s).
function announce(text) { $("status").textContent = text; }

let traceUi = null, spanUi = null;
function loadConfig() {
  return api("/api/config").then(c => { traceUi = c.trace_ui_template || null; spanUi = c.span_ui_template || null; }).catch(() => {});
}
// A tracing UI's link for a trace (and a span): the template with the IDs filled in.
function uiLink(tpl, traceId, spanId) {
  return tpl && traceId ? tpl.split("{trace_id}").join(traceId).split("{span_id}").join(spanId || "") : null;
}

// ---- statistics: one slim bar ----
async function loadStats() {
  let s;
  try { s = await api("/api/stats"); }
  catch (err) { if (!err.network) $("statsBody").textContent = "statistics unavailable: " + err.message; return; }
  const states = STATES.filter(k => s.states[k]).map(k => `<span class="${k}">${k} ${s.states[k]}</span>`).join(" · ") || "none yet";
  const f = s.funnel, e = s.events;
  const e2e = s.latency.filter(r => r.segment === "end_to_end").sort((a, b) => b.window.count - a.window.count);
  const e2eItems = e2e.slice(0, 4).map((r, i) => `<span class="st more" title="end to end, last ${s.window_secs} s: one sample per consumer group that consumed a message">${i ? "" : "<b>end to end</b> "}${esc(r.topic)} p50 ${r.window.p50_ms.toFixed(1)} ms · p99 ${r.window.p99_ms.toFixed(1)} ms · ${r.window.count} group completions</span>`).join("")
    + (e2e.length > 4 ? `<span class="st more dim">and ${e2e.length - 4} more topics</span>` : "");
  $("statsBody").innerHTML = `<span class="st"><b>states</b> ${states}</span>
    <span class="st"><b>funnel</b> sent ${f.sent} → stored ${f.stored}${pct(f.stored, f.sent)} → delivered ${f.delivered}${pct(f.delivered, f.sent)} → acked ${f.acked}${pct(f.acked, f.sent)}</span>
    <span class="st more" title="stored again after the dedup window ${e.duplicates_after_window || 0} · no-match ${e.no_match}"><b>events</b> duplicates ${e.duplicates} · redeliveries ${e.redeliveries} · dead letters ${e.dead_letters}</span>
    <span class="st more" title="${s.lag.stored_pending ?? 0} stored messages pending"><b>ingest</b> ${s.ingest.records} records · lag ${s.lag.pending}</span>
    ${e2eItems}`;
}
