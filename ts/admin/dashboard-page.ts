// The dashboard's one page (GET /dashboard): HTML, CSS and plain JavaScript, with hand-drawn SVG charts. No framework,
// no font, nothing fetched but the events stream, so it works with no network at all. Kept as strings in a module so
// the TypeScript build ships it in dist/ like the rest of the daemon.
//
// Everything the mesh names (workloads, namespaces, identities, policies, reasons) is hostile text: the script
// puts it into the page with textContent, setAttribute and createElementNS only, never as markup; the
// Content-Security-Policy allows exactly this inline script and style (by hash) and a connection to this origin.
import { createHash } from 'node:crypto';

const STYLE = String.raw`
:root { --in: #2563eb; --out: #0d9488; --deny: #dc2626; --ok: #16a34a; --warn: #d97706; --muted: #6b7280;
  --line: #e5e7eb; --bg: #f8fafc; --card: #fff; --ink: #111827; }
* { box-sizing: border-box; }
body { margin: 0; font: 13px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--ink);
  background: var(--bg); }
header { display: flex; align-items: baseline; gap: 16px; padding: 12px 20px; background: #0f172a; color: #e2e8f0; }
header h1 { margin: 0; font-size: 16px; font-weight: 600; }
header .node { font-family: ui-monospace, monospace; }
header .status { margin-left: auto; }
.status .dot { display: inline-block; width: 8px; height: 8px; border-radius: 50%; background: var(--muted);
  margin-right: 6px; }
.status.live .dot { background: #22c55e; }
.status.down .dot { background: var(--deny); }
main { padding: 16px 20px; display: grid; gap: 16px; grid-template-columns: repeat(2, minmax(0, 1fr)); }
section { background: var(--card); border: 1px solid var(--line); border-radius: 6px; padding: 12px 14px;
  min-width: 0; }
section.wide { grid-column: 1 / -1; }
h2 { margin: 0 0 8px; font-size: 13px; font-weight: 600; text-transform: uppercase; letter-spacing: .04em;
  color: #374151; }
h2 .note { text-transform: none; letter-spacing: 0; font-weight: 400; color: var(--muted); margin-left: 8px; }
.tiles { display: grid; grid-template-columns: repeat(5, minmax(0, 1fr)); gap: 12px; }
.tile .v { font-size: 22px; font-weight: 600; }
.tile .k { color: var(--muted); }
table { width: 100%; border-collapse: collapse; table-layout: auto; }
th, td { text-align: left; padding: 4px 8px 4px 0; border-bottom: 1px solid var(--line); vertical-align: top;
  overflow-wrap: anywhere; }
th { color: var(--muted); font-weight: 500; }
.scroll { max-height: 300px; overflow-y: auto; }
.scroll thead th { position: sticky; top: 0; background: var(--card); }
td.num, th.num { text-align: right; white-space: nowrap; }
.mono, .id { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12px; }
.muted { color: var(--muted); }
.empty td { color: var(--muted); font-style: italic; }
.badge { display: inline-block; padding: 0 6px; border-radius: 3px; font-size: 11px; font-weight: 600; color: #fff; }
.b-allow, .b-ok { background: var(--ok); }
.b-deny, .b-bad { background: var(--deny); }
.b-revoke, .b-warn { background: var(--warn); }
.b-in { background: var(--in); }
.b-out { background: var(--out); }
tr.deny td, tr.revoke td { background: #fef2f2; }
td.expiring { color: var(--warn); font-weight: 600; }
svg.chart { width: 100%; height: 170px; display: block; }
svg .grid { stroke: var(--line); stroke-width: 1; }
svg .axis { fill: var(--muted); font-size: 10px; }
svg .s { fill: none; stroke-width: 1.6; stroke-linejoin: round; }
svg .s-in { stroke: var(--in); }
svg .s-out { stroke: var(--out); stroke-dasharray: 5 3; }
svg .s-deny { stroke: var(--deny); }
.legend { display: flex; gap: 14px; color: var(--muted); margin-top: 4px; }
.legend i { display: inline-block; width: 12px; height: 3px; vertical-align: middle; margin-right: 5px; }
.legend .l-in { background: var(--in); }
.legend .l-out { background: var(--out); }
.legend .l-deny { background: var(--deny); }
.preview textarea { width: 100%; min-height: 96px; font: 12px ui-monospace, monospace; box-sizing: border-box;
  border: 1px solid var(--line); border-radius: 4px; padding: 6px; }
.preview button { margin: 6px 0; padding: 4px 12px; border: 1px solid var(--line); border-radius: 4px; background: var(--bg);
  cursor: pointer; }
.preview .summary { margin: 4px 0 8px; }
.preview .error { color: var(--deny); white-space: pre-wrap; }
@media (max-width: 900px) { main { grid-template-columns: 1fr; } .tiles { grid-template-columns: repeat(2, 1fr); } }
`;

const SCRIPT = String.raw`
(function () {
  'use strict';
  var WINDOW_MS = 10 * 60 * 1000;
  var MIN_SPAN_MS = 60 * 1000;
  var MAX_POINTS = 600;
  var MAX_DECISIONS = 100;
  var SVGNS = 'http://www.w3.org/2000/svg';
  var state = null;
  var points = [];
  var decisions = [];
  var missed = 0;

  function $(id) { return document.getElementById(id); }
  function el(tag, value, cls) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (value !== undefined && value !== null) e.textContent = String(value);
    return e;
  }
  function cell(content, cls) {
    var td = el('td', null, cls);
    if (content !== null && typeof content === 'object') td.appendChild(content);
    else td.textContent = content === undefined || content === null ? '' : String(content);
    return td;
  }
  function badge(textValue, kind) { return el('span', textValue, 'badge b-' + kind); }
  function ident(id, fallback) {
    var s = el('span', id || fallback || 'unknown', id ? 'id' : 'muted');
    if (id) s.setAttribute('title', id);
    return s;
  }
  function two(top, bottom) {
    var d = el('div');
    d.appendChild(top);
    if (bottom) d.appendChild(el('div', bottom, 'muted mono'));
    return d;
  }
  function fill(id, rows, total, cols, emptyText) {
    var body = $(id);
    var out = rows.slice();
    if (out.length === 0) {
      var tr = el('tr', null, 'empty');
      var td = el('td', emptyText);
      td.setAttribute('colspan', String(cols));
      tr.appendChild(td);
      out.push(tr);
    }
    body.replaceChildren.apply(body, out);
    var note = $(id + '-note');
    if (note) note.textContent = total > rows.length ? rows.length + ' of ' + total + ' shown' : String(total);
  }
  function bytes(n) {
    var units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    var i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i === 0 ? Math.round(n) : n.toFixed(n < 10 ? 1 : 0)) + ' ' + units[i];
  }
  function num(n) { return n >= 100 ? String(Math.round(n)) : n >= 10 ? n.toFixed(1) : n.toFixed(2).replace(/\.?0+$/, ''); }
  function clock(t) { return new Date(t).toTimeString().slice(0, 8); }
  function span(ms) {
    var s = Math.round(Math.abs(ms) / 1000);
    var d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60);
    return d > 0 ? d + 'd ' + h + 'h' : h > 0 ? h + 'h ' + m + 'm' : m > 0 ? m + 'm ' + (s % 60) + 's' : s + 's';
  }

  function renderTiles() {
    var last = points.length ? points[points.length - 1] : null;
    var denied = 0;
    points.forEach(function (p) { denied += p.deniedPs * state.intervalMs / 1000; });
    $('t-workloads').textContent = String(state.workloads.total);
    $('t-tunnels').textContent = state.tunnels.inbound + ' in / ' + state.tunnels.outbound + ' out';
    $('t-open').textContent = state.open.inbound + ' in / ' + state.open.outbound + ' out';
    $('t-rate').textContent = last ? bytes(last.inboundBps + last.outboundBps) + '/s' : '–';
    $('t-denied').textContent = String(Math.round(denied));
    $('t-resilience').textContent = state.resilience.retries + ' retried / ' + state.resilience.ejected + ' ejected';
  }

  function renderFlows() {
    fill('flows', state.flows.items.map(function (f) {
      var tr = el('tr');
      tr.appendChild(cell(badge(f.direction === 'inbound' ? 'in' : 'out', f.direction === 'inbound' ? 'in' : 'out')));
      tr.appendChild(cell(two(ident(f.srcIdentity), f.srcWorkload)));
      tr.appendChild(cell(two(ident(f.dstIdentity), f.dstService || f.dstWorkload)));
      tr.appendChild(cell(f.mtls ? 'mTLS' : 'plaintext', f.mtls ? '' : 'muted'));
      tr.appendChild(cell(String(f.open), 'num'));
      tr.appendChild(cell(bytes(f.bytes), 'num'));
      return tr;
    }), state.flows.total, 6, 'no connection is open');
  }

  function renderConnections() {
    fill('connections', state.connections.items.map(function (c) {
      var tr = el('tr');
      tr.appendChild(cell(c.workload));
      tr.appendChild(cell(badge(c.direction === 'inbound' ? 'in' : 'out', c.direction === 'inbound' ? 'in' : 'out')));
      tr.appendChild(cell(c.src, 'mono'));
      tr.appendChild(cell(c.dst, 'mono'));
      tr.appendChild(cell(c.protocol));
      return tr;
    }), state.connections.total, 5, 'none');
  }

  function renderDecisions() {
    fill('decisions', decisions.map(function (d) {
      var tr = el('tr', null, d.verdict);
      tr.appendChild(cell(clock(d.t), 'mono'));
      tr.appendChild(cell(badge(d.verdict === 'allow' ? 'allowed' : d.verdict === 'deny' ? 'denied' : 'revoked', d.verdict)));
      tr.appendChild(cell(two(ident(d.srcIdentity, 'no identity (plaintext)'), d.srcAddr)));
      tr.appendChild(cell(two(ident(d.dstIdentity, d.dstWorkload), d.dstWorkload + (d.dstAddr ? ' ' + d.dstAddr : ''))));
      tr.appendChild(cell(d.policy || '–', d.policy ? 'mono policy' : 'muted'));
      tr.appendChild(cell(d.reason || '–', d.reason ? '' : 'muted'));
      return tr;
    }), decisions.length, 6, 'none yet: decisions appear as connections are allowed (when they end) or denied');
    $('decisions-missed').textContent = missed > 0 ? missed + ' more not listed (log rate limit)' : '';
  }

  function renderWorkloads() {
    fill('workloads', state.workloads.items.map(function (w) {
      var tr = el('tr');
      tr.appendChild(cell(two(el('span', w.name), w.namespace)));
      tr.appendChild(cell(ident(w.identity)));
      tr.appendChild(cell(w.protocol));
      tr.appendChild(cell(w.ips.join(', '), 'mono'));
      return tr;
    }), state.workloads.total, 4, 'no workload on this node');
  }

  function renderCertificates() {
    fill('certificates', state.certificates.items.map(function (c) {
      var tr = el('tr');
      var ok = c.state === 'Available';
      var left = c.notAfter === null ? null : c.notAfter - state.at;
      tr.appendChild(cell(ident(c.identity)));
      tr.appendChild(cell(badge(ok ? 'Available' : c.state.split(':')[0], ok ? 'ok' : c.state === 'Initializing' ? 'warn' : 'bad')));
      var exp = cell(left === null ? '–' : left <= 0 ? 'expired ' + span(left) + ' ago' : 'in ' + span(left), left !== null && left < 3600000 ? 'num expiring' : 'num');
      if (c.notAfter !== null) exp.setAttribute('title', new Date(c.notAfter).toISOString());
      tr.appendChild(exp);
      if (!ok && c.state !== 'Initializing') tr.appendChild(cell(c.state, 'muted'));
      return tr;
    }), state.certificates.total, 3, 'no certificate');
  }

  // The axis top: 1, 2 or 5 times a power of ten, of the largest value in its unit (a power of 1024 for bytes).
  function niceMax(v, base) {
    if (!(v > 0)) return 1;
    var unit = base > 1 ? Math.pow(base, Math.max(0, Math.floor(Math.log(v) / Math.log(base)))) : 1;
    var u = v / unit;
    var p = Math.pow(10, Math.floor(Math.log10(u)));
    var m = u / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p * unit;
  }
  function ago(ms) { return ms < 120000 ? Math.round(ms / 1000) + ' s' : Math.round(ms / 60000) + ' min'; }
  function svgEl(tag, attrs, textValue) {
    var e = document.createElementNS(SVGNS, tag);
    for (var k in attrs) e.setAttribute(k, String(attrs[k]));
    if (textValue !== undefined) e.textContent = textValue;
    return e;
  }
  // The last ten minutes, or since the first point when that is shorter (at least a minute): a page opened a moment
  // ago shows its points across the chart, not in its last pixels.
  function chart(id, series, fmt, base) {
    var svg = $(id);
    var W = 600, H = 170, L = 64, R = 8, T = 8, B = 20;
    var now = state.at, gap = 3 * state.intervalMs;
    var spanMs = Math.min(WINDOW_MS, Math.max(MIN_SPAN_MS, points.length ? now - points[0].t : 0));
    var from = now - spanMs;
    var shown = points.filter(function (p) { return p.t >= from; });
    var max = 0;
    shown.forEach(function (p) { series.forEach(function (s) { max = Math.max(max, p[s.key]); }); });
    var top = niceMax(max, base);
    var x = function (t) { return L + (t - from) / spanMs * (W - L - R); };
    var y = function (v) { return T + (1 - v / top) * (H - T - B); };
    var parts = [];
    for (var g = 0; g <= 2; g++) {
      var gy = y(top * g / 2);
      parts.push(svgEl('line', { x1: L, x2: W - R, y1: gy, y2: gy, 'class': 'grid' }));
      parts.push(svgEl('text', { x: L - 6, y: gy + 3, 'text-anchor': 'end', 'class': 'axis' }, fmt(top * g / 2)));
    }
    [[ago(spanMs) + ' ago', from, 'start'], [ago(spanMs / 2) + ' ago', from + spanMs / 2, 'middle'], ['now', now, 'end']].forEach(function (a) {
      parts.push(svgEl('text', { x: x(a[1]), y: H - 5, 'text-anchor': a[2], 'class': 'axis' }, a[0]));
    });
    series.forEach(function (s) {
      var seg = [];
      var flush = function () {
        if (seg.length > 0) parts.push(svgEl('polyline', { points: seg.join(' '), 'class': 's s-' + s.cls, 'data-series': s.key }));
        seg = [];
      };
      shown.forEach(function (p, i) {
        if (i > 0 && p.t - shown[i - 1].t > gap) flush();
        seg.push(x(p.t).toFixed(1) + ',' + y(p[s.key]).toFixed(1));
      });
      flush();
    });
    svg.replaceChildren.apply(svg, parts);
    svg.setAttribute('data-points', String(shown.length));
    svg.setAttribute('data-max', String(max));
  }
  function renderCharts() {
    chart('throughput', [{ key: 'inboundBps', cls: 'in' }, { key: 'outboundBps', cls: 'out' }], function (v) { return bytes(v) + '/s'; }, 1024);
    chart('rate', [{ key: 'inboundCps', cls: 'in' }, { key: 'outboundCps', cls: 'out' }, { key: 'deniedPs', cls: 'deny' }], function (v) { return num(v) + '/s'; }, 1);
  }

  function render() {
    $('node').textContent = state.node + ' (' + state.mode + ')';
    $('updated').textContent = 'updated ' + clock(state.at);
    renderTiles();
    renderCharts();
    renderFlows();
    renderConnections();
    renderDecisions();
    renderWorkloads();
    renderCertificates();
  }

  function status(cls, textValue) {
    var s = $('status');
    s.className = 'status ' + cls;
    $('status-text').textContent = textValue;
  }

  // Policy impact preview: the candidate goes to POST /debug/authz/preview (this origin; the admin's guard admits a
  // same-origin page), and the answer is shown as text like everything else.
  function previewFlows(id, flows, total, emptyText) {
    fill(id, flows.map(function (f) {
      var tr = el('tr');
      tr.appendChild(cell(two(el('span', f.workload.namespace + '/' + f.workload.name), f.dst)));
      tr.appendChild(cell(two(ident(f.srcIdentity, 'plaintext'), f.srcIp)));
      tr.appendChild(cell(f.protocol));
      tr.appendChild(cell(f.count, 'num'));
      tr.appendChild(cell(badge(f.now.allowed ? 'allow' : 'deny', f.now.allowed ? 'allow' : 'deny')));
      var by = f.candidate.policy ? f.candidate.policy + (f.candidate.rule !== undefined ? ' rule ' + f.candidate.rule : '') : f.candidate.reason;
      tr.appendChild(cell(two(badge(f.candidate.allowed ? 'allow' : 'deny', f.candidate.allowed ? 'allow' : 'deny'), by)));
      return tr;
    }), total, 6, emptyText);
  }
  $('preview-run').addEventListener('click', function () {
    var out = $('preview-summary');
    out.className = 'summary';
    out.textContent = 'judging…';
    fetch('/debug/authz/preview', { method: 'POST', headers: { 'content-type': 'text/yaml' }, body: $('preview-policy').value })
      .then(function (r) { return r.text().then(function (t) { return { ok: r.ok, status: r.status, text: t }; }); })
      .then(function (r) {
        if (!r.ok) {
          out.className = 'summary error';
          out.textContent = r.status + ': ' + r.text;
          return;
        }
        var a = JSON.parse(r.text);
        out.textContent = a.candidates.join(', ') + ': would close ' + a.wouldCloseConnections + ' live connection(s), would allow ' +
          a.wouldAllowAttempts + ' recently denied attempt(s) (' + a.connectionsJudged + ' connections and ' + a.denialsJudged +
          ' denials judged' + (a.judgedAsEnforced.length ? '; dry-run judged as enforced' : '') + ')';
        previewFlows('preview-close', a.wouldClose, a.wouldCloseConnections, 'no live connection would close');
        previewFlows('preview-allow', a.wouldAllow, a.wouldAllowAttempts, 'no recently denied attempt would be allowed');
      })
      .catch(function (e) { out.className = 'summary error'; out.textContent = String(e); });
  });

  var events = new EventSource('/dashboard/events');
  events.addEventListener('snapshot', function (e) {
    var m = JSON.parse(e.data);
    state = m;
    points = m.points.filter(function (p) { return p.t >= m.at - WINDOW_MS; }).slice(-MAX_POINTS);
    decisions = m.decisions.slice().reverse().slice(0, MAX_DECISIONS);
    missed = m.missedDecisions;
    status('live', 'live');
    render();
  });
  events.addEventListener('update', function (e) {
    var m = JSON.parse(e.data);
    state = m;
    points = points.concat(m.points).filter(function (p) { return p.t >= m.at - WINDOW_MS; }).slice(-MAX_POINTS);
    decisions = m.decisions.slice().reverse().concat(decisions).slice(0, MAX_DECISIONS);
    missed += m.missedDecisions;
    render();
  });
  events.onopen = function () { status('live', 'live'); };
  events.onerror = function () { status('down', 'reconnecting…'); };
})();
`;

const BODY = `
<header>
  <h1>ztunnel-node</h1><span class="node" id="node">connecting…</span>
  <span class="muted" id="updated"></span>
  <span class="status" id="status"><span class="dot"></span><span id="status-text">connecting…</span></span>
</header>
<main>
  <section class="wide tiles">
    <div class="tile"><div class="v" id="t-workloads">–</div><div class="k">workloads on this node</div></div>
    <div class="tile"><div class="v" id="t-tunnels">–</div><div class="k">HBONE tunnels</div></div>
    <div class="tile"><div class="v" id="t-open">–</div><div class="k">connections open</div></div>
    <div class="tile"><div class="v" id="t-rate">–</div><div class="k">throughput now</div></div>
    <div class="tile"><div class="v" id="t-denied">–</div><div class="k">denied, last 10 min</div></div>
    <div class="tile"><div class="v" id="t-resilience">–</div><div class="k">connects retried / endpoints ejected</div></div>
  </section>
  <section>
    <h2>Throughput</h2>
    <svg class="chart" id="throughput" viewBox="0 0 600 170" preserveAspectRatio="none" role="img" aria-label="bytes per second"></svg>
    <div class="legend"><span><i class="l-in"></i>inbound</span><span><i class="l-out"></i>outbound</span></div>
  </section>
  <section>
    <h2>Connection rate</h2>
    <svg class="chart" id="rate" viewBox="0 0 600 170" preserveAspectRatio="none" role="img" aria-label="connections per second"></svg>
    <div class="legend"><span><i class="l-in"></i>inbound opened</span><span><i class="l-out"></i>outbound opened</span><span><i class="l-deny"></i>denied</span></div>
  </section>
  <section class="wide">
    <h2>Authorization decisions<span class="note" id="decisions-missed"></span></h2>
    <div class="scroll"><table><thead><tr><th>time</th><th>decision</th><th>source</th><th>destination</th><th>policy</th><th>reason</th></tr></thead>
    <tbody id="decisions"></tbody></table></div>
  </section>
  <section class="wide">
    <h2>Live connections by identity<span class="note" id="flows-note"></span></h2>
    <div class="scroll"><table><thead><tr><th></th><th>source</th><th>destination</th><th>security</th><th class="num">open</th><th class="num">bytes so far</th></tr></thead>
    <tbody id="flows"></tbody></table></div>
  </section>
  <section>
    <h2>Live connections<span class="note" id="connections-note"></span></h2>
    <div class="scroll"><table><thead><tr><th>workload</th><th></th><th>source</th><th>destination</th><th>protocol</th></tr></thead>
    <tbody id="connections"></tbody></table></div>
  </section>
  <section>
    <h2>Workloads on this node<span class="note" id="workloads-note"></span></h2>
    <div class="scroll"><table><thead><tr><th>workload</th><th>identity</th><th>protocol</th><th>addresses</th></tr></thead>
    <tbody id="workloads"></tbody></table></div>
  </section>
  <section class="wide preview">
    <h2>Policy impact preview</h2>
    <div class="muted">A candidate authorization policy in the local config's form (YAML or JSON): what applying it would close and allow, judged by the dataplane, nothing applied.</div>
    <textarea id="preview-policy" spellcheck="false" aria-label="candidate policy">name: example
namespace: default
scope: Namespace
action: Deny
rules: [[[{destinationPorts: [9090]}]]]</textarea>
    <button id="preview-run" type="button">Preview</button>
    <div class="summary" id="preview-summary"></div>
    <h2>Would close<span class="note" id="preview-close-note"></span></h2>
    <div class="scroll"><table><thead><tr><th>destination</th><th>source</th><th>protocol</th><th class="num">count</th><th>now</th><th>with it</th></tr></thead>
    <tbody id="preview-close"></tbody></table></div>
    <h2>Would allow<span class="note" id="preview-allow-note"></span></h2>
    <div class="scroll"><table><thead><tr><th>destination</th><th>source</th><th>protocol</th><th class="num">count</th><th>now</th><th>with it</th></tr></thead>
    <tbody id="preview-allow"></tbody></table></div>
  </section>
  <section class="wide">
    <h2>Certificates<span class="note" id="certificates-note"></span></h2>
    <div class="scroll"><table><thead><tr><th>identity</th><th>state</th><th class="num">expires</th></tr></thead>
    <tbody id="certificates"></tbody></table></div>
  </section>
</main>`;

const sha256 = (s: string) => `'sha256-${createHash('sha256').update(s).digest('base64')}'`;

export const DASHBOARD_HTML = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>ztunnel-node dashboard</title><link rel="icon" href="data:,">
<style>${STYLE}</style>
</head><body>${BODY}
<script>${SCRIPT}</script>
</body></html>
`;

/** Only this page's own script and style run, and it talks only to the admin server it came from. */
export const DASHBOARD_CSP = [
  "default-src 'none'",
  `script-src ${sha256(SCRIPT)}`,
  `style-src ${sha256(STYLE)}`,
  "connect-src 'self'",
  "img-src data:",
  "base-uri 'none'",
  "form-action 'none'",
  "frame-ancestors 'none'",
].join('; ');
