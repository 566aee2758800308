// `ztunnel-node demo`: the whole product in one command, as a non-root user on one machine.
//
// Two daemons run as child processes, each playing one Kubernetes node in PROXY_MODE=local (node-a hosts the
// `sleep` workload at 127.0.1.10, node-b hosts `echo` at 127.0.2.10; examples/demo.yaml). They share a
// built-in CA directory, so their workloads trust each other. The demo process plays both applications: it runs
// the echo server on 127.0.2.10:8080 and, as `sleep`, resolves echo's service name through sleep's DNS proxy
// (127.0.1.10:15053, answered by node-a from the mesh state) and connects to the answer, the service VIP, through
// node-a's SOCKS5 listener (127.0.1.10:15080). node-a carries the bytes over HBONE (mTLS + HTTP/2 CONNECT) to node-b's 127.0.2.10:15008,
// which delivers them to the echo server. The table printed afterwards comes from what an operator would look
// at: both nodes' /metrics.
import { spawn, type ChildProcess } from 'node:child_process';
import { Resolver } from 'node:dns/promises';
import { copyFile, mkdtemp, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { createServer as createTcpServer, type Server as TcpServer, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { CONFIG_KEYS } from '../config/index.js';
import { toPlain } from '../log/logger.js';
import { parsePrometheusText, sumSamples, type Sample } from './prom-text.js';
import { socks5Connect } from './socks5-client.js';

export const DEMO_USAGE = `usage: ztunnel-node demo [--ca-dir DIR] [--no-wait]

Starts two proxies (node-a, node-b) on loopback addresses, sends a few messages from workload "sleep" on node-a
to workload "echo" on node-b through HBONE, and prints what both proxies recorded. Then it writes an authorization
policy denying "sleep" into the config file the proxies watch, and shows a live connection cut and a new one refused.

  --ca-dir DIR   built-in CA directory to use (default: a temporary directory, removed at exit)
  --no-wait      exit after printing the table instead of waiting for Ctrl-C
`;

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const BIN = join(ROOT, 'bin', 'ztunnel-node.js');
const DEMO_YAML = join(ROOT, 'examples', 'demo.yaml');

/** Fixed by examples/demo.yaml. */
const SLEEP_IP = '127.0.1.10';
const ECHO_IP = '127.0.2.10';
const ECHO_PORT = 8080;
const SOCKS5_PORT = 15080;
const DNS_PORT = 15053;
const ECHO_HOST = 'echo.default.svc.cluster.local';
const ECHO_SERVICE_PORT = 80;
const SLEEP_ID = 'spiffe://cluster.local/ns/default/sa/sleep';
const ECHO_ID = 'spiffe://cluster.local/ns/default/sa/echo';

/** Generous: the first start may create the CA root and both nodes sign certificates. */
const READY_TIMEOUT_MS = 30_000;
/** Connection counters are recorded when the connection closes; give both nodes a moment to see the close. */
const METRICS_SETTLE_TIMEOUT_MS = 5_000;
/** Short drain: the demo's connections are done when it stops. */
const CHILD_DRAIN_DEADLINE = '1s';
const CHILD_KILL_AFTER_MS = 5_000;
const MESSAGES = ['hello from sleep', 'HBONE is HTTP/2 CONNECT over mTLS', 'goodbye'];

interface NodeSpec {
  name: string;
  admin: number;
  stats: number;
  readiness: number;
}

interface RunningNode extends NodeSpec {
  child: ChildProcess;
  exited: Promise<number | null>;
}

interface DemoArgs {
  caDir: string | null;
  wait: boolean;
}

function parseDemoArgs(args: readonly string[]): DemoArgs | string {
  const out: DemoArgs = { caDir: null, wait: true };
  for (let i = 0; i < args.length; i++) {
    const a = args[i] as string;
    if (a === '--no-wait') out.wait = false;
    else if (a.startsWith('--ca-dir=')) out.caDir = a.slice('--ca-dir='.length);
    else if (a === '--ca-dir') {
      const v = args[++i];
      if (v === undefined) return '--ca-dir needs a directory';
      out.caDir = v;
    } else return `unknown argument "${a}"`;
  }
  return out;
}

/** `preferred` if it is free on 127.0.0.1, else any free port. */
function pickPort(preferred: number): Promise<number> {
  const tryListen = (port: number) =>
    new Promise<number>((resolve, reject) => {
      const s = createTcpServer();
      s.once('error', reject);
      s.listen({ host: '127.0.0.1', port, exclusive: true }, () => {
        const p = (s.address() as { port: number }).port;
        s.close(() => resolve(p));
      });
    });
  return tryListen(preferred).catch(() => tryListen(0));
}

async function nodeSpec(name: string, base: number): Promise<NodeSpec> {
  return { name, admin: await pickPort(base), stats: await pickPort(base + 20), readiness: await pickPort(base + 21) };
}

/** The policy the demo adds to show authorization: deny everything from sleep's identity to the namespace. */
const DENY_SLEEP_POLICY = `
policies:
- name: deny-sleep
  namespace: default
  scope: Namespace
  action: Deny
  rules:
  - - - principals: [{Exact: "cluster.local/ns/default/sa/sleep"}]
`;

function startNode(spec: NodeSpec, caDir: string, configPath: string, env: Readonly<Record<string, string | undefined>>): RunningNode {
  // The children get exactly the demo's configuration, not whatever ztunnel variables the shell has set.
  const childEnv: Record<string, string> = {};
  for (const [k, v] of Object.entries(env)) {
    if (v !== undefined && !(CONFIG_KEYS as string[]).includes(k)) childEnv[k] = v;
  }
  Object.assign(childEnv, {
    PROXY_MODE: 'local',
    NODE_NAME: spec.name,
    LOCAL_XDS_PATH: configPath,
    LOCAL_CA_DIR: caDir,
    XDS_ADDRESS: '',
    CA_ADDRESS: '',
    ADMIN_ADDR: `127.0.0.1:${spec.admin}`,
    STATS_ADDR: `127.0.0.1:${spec.stats}`,
    READINESS_ADDR: `127.0.0.1:${spec.readiness}`,
    LOG_FORMAT: 'json',
    RUST_LOG: 'warn',
    CONNECTION_TERMINATION_DEADLINE: CHILD_DRAIN_DEADLINE,
  });
  const child = spawn(process.execPath, [BIN, 'proxy'], { env: childEnv, stdio: ['ignore', 'pipe', 'pipe'] });
  for (const stream of [child.stdout, child.stderr]) {
    if (!stream) continue;
    createInterface({ input: stream }).on('line', (line) => {
      process.stderr.write(`[${spec.name}] ${line.startsWith('{') ? toPlain(line) : `${line}\n`}`);
    });
  }
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  return { ...spec, child, exited };
}

async function httpGet(url: string): Promise<{ status: number; body: string }> {
  const res = await fetch(url);
  return { status: res.status, body: await res.text() };
}

async function waitReady(node: RunningNode): Promise<void> {
  const url = `http://127.0.0.1:${node.readiness}/healthz/ready`;
  const deadline = Date.now() + READY_TIMEOUT_MS;
  let last = 'no answer';
  let exitCode: number | null | undefined;
  node.exited.then(
    (c) => (exitCode = c),
    () => undefined,
  );
  while (Date.now() < deadline) {
    if (exitCode !== undefined) throw new Error(`${node.name} exited with code ${String(exitCode)} before it was ready`);
    try {
      const r = await httpGet(url);
      if (r.status === 200) return;
      last = r.body.trim();
    } catch (err) {
      last = (err as Error).message;
    }
    await sleep(200);
  }
  throw new Error(`${node.name} not ready after ${READY_TIMEOUT_MS / 1000} s (${last})`);
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function startEchoServer(): Promise<TcpServer> {
  return new Promise((resolve, reject) => {
    const server = createTcpServer((sock) => {
      sock.on('error', () => sock.destroy());
      sock.pipe(sock);
    });
    server.once('error', (err) => reject(new Error(`cannot start the echo server on ${ECHO_IP}:${ECHO_PORT}: ${err.message}`)));
    server.listen({ host: ECHO_IP, port: ECHO_PORT }, () => resolve(server));
  });
}

/** Writes each message and waits for the same bytes back. */
async function exchange(sock: Socket, messages: readonly string[]): Promise<number> {
  let pending = Buffer.alloc(0);
  let wake: (() => void) | null = null;
  let failure: Error | null = null;
  sock.on('data', (chunk: Buffer) => {
    pending = Buffer.concat([pending, chunk]);
    wake?.();
  });
  sock.on('error', (err) => {
    failure = err;
    wake?.();
  });
  sock.on('close', () => {
    failure ??= new Error('the connection closed before the echo arrived');
    wake?.();
  });
  sock.resume();
  let echoed = 0;
  for (const m of messages) {
    const expected = Buffer.from(`${m}\n`);
    sock.write(expected);
    while (pending.length < expected.length) {
      if (failure) throw failure;
      await new Promise<void>((resolve) => (wake = resolve));
    }
    const got = pending.subarray(0, expected.length);
    pending = pending.subarray(expected.length);
    if (!got.equals(expected)) throw new Error(`echo mismatch: sent ${JSON.stringify(m)}, got ${JSON.stringify(got.toString())}`);
    echoed++;
  }
  return echoed;
}

async function scrape(node: NodeSpec): Promise<Sample[]> {
  const r = await httpGet(`http://127.0.0.1:${node.stats}/metrics`);
  if (r.status !== 200) throw new Error(`${node.name} /metrics answered ${r.status}`);
  return parsePrometheusText(r.body);
}

/** Waits until node-a saw the connection close as source and node-b as destination. */
async function settledMetrics(a: NodeSpec, b: NodeSpec): Promise<{ a: Sample[]; b: Sample[] }> {
  const deadline = Date.now() + METRICS_SETTLE_TIMEOUT_MS;
  for (;;) {
    const [ma, mb] = await Promise.all([scrape(a), scrape(b)]);
    const closedA = sumSamples(ma, 'istio_tcp_connections_closed_total', { reporter: 'source' });
    const closedB = sumSamples(mb, 'istio_tcp_connections_closed_total', { reporter: 'destination' });
    if ((closedA >= 1 && closedB >= 1) || Date.now() > deadline) return { a: ma, b: mb };
    await sleep(200);
  }
}

/** Write then rename, as editors and ConfigMap updates do: the watcher never sees a half-written file. */
async function replaceFile(path: string, text: string): Promise<void> {
  await writeFile(`${path}.tmp`, text);
  await rename(`${path}.tmp`, path);
}

/**
 * Opens a connection sleep -> echo, appends a DENY for sleep to the config file the daemons watch, and shows the
 * live connection being cut and a new one refused; then restores the file.
 */
async function policyScene(configPath: string, b: NodeSpec): Promise<{ ok: boolean; rows: Array<[string, string]> }> {
  const original = await readFile(configPath, 'utf8');
  const live = await socks5Connect({ proxyHost: SLEEP_IP, proxyPort: SOCKS5_PORT, destHost: ECHO_IP, destPort: ECHO_PORT });
  await exchange(live, ['still allowed']);
  const closed = new Promise<number>((resolve) => live.once('close', () => resolve(performance.now())));
  live.on('data', () => undefined);
  live.on('error', () => undefined);
  live.resume();
  const written = performance.now();
  await replaceFile(configPath, original + DENY_SLEEP_POLICY);
  const closedAt = await Promise.race([closed, sleep(5_000).then(() => null)]);
  let refused = 'NOT refused';
  let refusedOk = false;
  try {
    const s = await socks5Connect({ proxyHost: SLEEP_IP, proxyPort: SOCKS5_PORT, destHost: ECHO_IP, destPort: ECHO_PORT });
    s.destroy();
  } catch (err) {
    refused = `refused: ${err instanceof Error ? err.message : String(err)}`;
    refusedOk = true;
  }
  const samples = await scrape(b);
  const denied = sumSamples(samples, 'istio_tcp_connections_failed_total', { reporter: 'destination', response_flags: 'DENY' });
  await replaceFile(configPath, original);
  live.destroy();
  return {
    ok: closedAt !== null && refusedOk && denied > 0,
    rows: [
      ['policy added', 'deny-sleep: DENY principals cluster.local/ns/default/sa/sleep (namespace default)'],
      ['live connection', closedAt === null ? 'NOT cut within 5 s' : `cut ${(closedAt - written).toFixed(0)} ms after the file was written`],
      ['new connection', refused],
      ['node-b', `${denied} connection(s) with response_flags="DENY"; the policy was then removed again`],
    ],
  };
}

function table(rows: ReadonlyArray<[string, string]>): string {
  const width = Math.max(...rows.map(([k]) => k.length));
  return rows.map(([k, v]) => `  ${k.padEnd(width)}  ${v}`).join('\n');
}

export async function runDemo(args: readonly string[], env: Readonly<Record<string, string | undefined>>): Promise<number> {
  const parsed = parseDemoArgs(args);
  if (typeof parsed === 'string') {
    process.stderr.write(`ztunnel-node demo: ${parsed}\n\n${DEMO_USAGE}`);
    return 2;
  }
  const tempCa = parsed.caDir === null ? await mkdtemp(join(tmpdir(), 'ztunnel-node-demo-ca-')) : null;
  const caDir = parsed.caDir ?? (tempCa as string);
  const nodes: RunningNode[] = [];
  const cleanupDirs: string[] = [];
  let echo: TcpServer | null = null;
  let cleaning: Promise<void> | null = null;

  const cleanup = () =>
    (cleaning ??= (async () => {
      await Promise.all(
        nodes.map(async (n) => {
          if (n.child.exitCode !== null || n.child.signalCode !== null) return;
          n.child.kill('SIGTERM');
          const killer = setTimeout(() => n.child.kill('SIGKILL'), CHILD_KILL_AFTER_MS);
          await n.exited;
          clearTimeout(killer);
        }),
      );
      await new Promise<void>((resolve) => (echo ? echo.close(() => resolve()) : resolve()));
      if (tempCa) await rm(tempCa, { recursive: true, force: true });
      for (const d of cleanupDirs) await rm(d, { recursive: true, force: true });
    })());

  // Ctrl-C reaches the children too (same process group); they drain while we wait for them.
  let interrupted: (() => void) | null = null;
  const onSigint = () => {
    process.stderr.write('\nstopping...\n');
    interrupted?.();
    cleanup().catch((err: unknown) => process.stderr.write(`cleanup failed: ${err instanceof Error ? err.message : String(err)}\n`));
  };
  process.on('SIGINT', onSigint);
  process.on('SIGTERM', onSigint);

  try {
    const specA = await nodeSpec('node-a', 15000);
    const specB = await nodeSpec('node-b', 15100);
    // The daemons read a copy of examples/demo.yaml, which the demo then edits to add and remove a policy.
    const workDir = await mkdtemp(join(tmpdir(), 'ztunnel-node-demo-'));
    cleanupDirs.push(workDir);
    const configPath = join(workDir, 'demo.yaml');
    await copyFile(DEMO_YAML, configPath);
    nodes.push(startNode(specA, caDir, configPath, env), startNode(specB, caDir, configPath, env));
    echo = await startEchoServer();
    process.stderr.write('starting node-a and node-b...\n');
    await Promise.all(nodes.map(waitReady));
    const [a, b] = nodes as [RunningNode, RunningNode];

    // As a captured pod's resolver would: ask sleep's DNS proxy (node-a answers from the mesh: the service VIP).
    const resolver = new Resolver({ timeout: 2_000, tries: 2 });
    resolver.setServers([`${SLEEP_IP}:${DNS_PORT}`]);
    const tDns = performance.now();
    const [echoVip] = await resolver.resolve4(ECHO_HOST);
    const dnsMs = performance.now() - tDns;
    if (echoVip === undefined) throw new Error(`${ECHO_HOST} did not resolve through ${SLEEP_IP}:${DNS_PORT}`);
    const t0 = performance.now();
    const sock = await socks5Connect({ proxyHost: SLEEP_IP, proxyPort: SOCKS5_PORT, destHost: echoVip, destPort: ECHO_SERVICE_PORT });
    const tConnect = performance.now() - t0;
    const echoed = await exchange(sock, MESSAGES);
    const tTotal = performance.now() - t0;
    await new Promise<void>((resolve) => {
      sock.once('close', () => resolve());
      sock.end();
    });

    const m = await settledMetrics(a, b);
    const inbound = m.b.find((s) => s.name === 'istio_tcp_connections_opened_total' && s.labels.reporter === 'destination');
    const mtls = sumSamples(m.b, 'istio_tcp_connections_opened_total', { reporter: 'destination', connection_security_policy: 'mutual_tls' }) > 0;
    const srcId = inbound?.labels.source_principal;
    const dstId = inbound?.labels.destination_principal;
    const principal = (v: string | undefined, expected: string) => (v && v !== 'unknown' ? `spiffe://${v.replace(/^spiffe:\/\//, '')}` : `${expected} (expected; not in metrics)`);
    const bytes = (s: Sample[], reporter: string) =>
      `sent ${sumSamples(s, 'istio_tcp_sent_bytes_total', { reporter })} B, received ${sumSamples(s, 'istio_tcp_received_bytes_total', { reporter })} B`;

    process.stdout.write(`
ztunnel-node demo: sleep (node-a, ${SLEEP_IP}) -> echo (node-b, ${ECHO_IP}:${ECHO_PORT}) over HBONE

${table([
  ['DNS', `${ECHO_HOST} -> ${echoVip} (sleep's DNS proxy ${SLEEP_IP}:${DNS_PORT}, ${dnsMs.toFixed(1)} ms)`],
  ['connected to', `${echoVip}:${ECHO_SERVICE_PORT}, the service VIP; node-a picked the endpoint ${ECHO_IP}:${ECHO_PORT}`],
  ['source identity', principal(srcId, SLEEP_ID)],
  ['destination identity', principal(dstId, ECHO_ID)],
  ['mTLS', mtls ? 'yes (node-b: connection_security_policy="mutual_tls")' : 'NO (node-b did not report mutual_tls)'],
  ['messages echoed', `${echoed}/${MESSAGES.length}`],
  ['node-a (reporter=source)', bytes(m.a, 'source')],
  ['node-b (reporter=destination)', bytes(m.b, 'destination')],
  ['time', `${tConnect.toFixed(1)} ms to connect, ${tTotal.toFixed(1)} ms for all round trips`],
])}

${table(nodes.map((n) => [n.name, `admin http://127.0.0.1:${n.admin}/config_dump  metrics http://127.0.0.1:${n.stats}/metrics  ready http://127.0.0.1:${n.readiness}/healthz/ready`]))}
`);
    const policy = await policyScene(configPath, b);
    process.stdout.write(`
Authorization: a DENY policy is written into the config file while a connection is open

${table(policy.rows)}
`);
    const ok = echoed === MESSAGES.length && mtls && policy.ok;
    if (parsed.wait && !cleaning) {
      process.stdout.write('\nPress Ctrl-C to stop.\n');
      await new Promise<void>((resolve) => {
        interrupted = resolve;
        // A node dying while we wait ends the demo too.
        for (const n of nodes) n.exited.then(() => resolve(), () => resolve());
      });
    }
    await cleanup();
    return ok ? 0 : 1;
  } catch (err) {
    process.stderr.write(`ztunnel-node demo: ${err instanceof Error ? err.message : String(err)}\n`);
    await cleanup();
    return 1;
  } finally {
    process.off('SIGINT', onSigint);
    process.off('SIGTERM', onSigint);
  }
}
