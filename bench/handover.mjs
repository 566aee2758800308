// The hand-over under load (issue 27): one node-a daemon in local mode holds N established connections (SOCKS5 →
// a TCP echo server outside the mesh: TCP ⇄ TCP relays), a successor daemon is started on the same HANDOVER_SOCKET,
// and we read how long the exchange took on each side, how long the connections were paused, the longest gap a
// probing connection saw in its echoes, and whether every connection is intact afterwards.
//
//   node bench/handover.mjs                        9,000 connections, 100 probes, 3 rounds
//   node bench/handover.mjs --connections 1000 --rounds 1
//   node bench/handover.mjs --json bench/results/handover.json
//   node bench/handover.mjs --hbone                the echo server is a mesh workload on node-b (its own daemon, not
//                                                  restarted): every connection is a stream of node-a's HBONE pool
//
// The connections: every one sends a 16-byte tagged message after the hand-over and must get it back (lost = those
// that do not). The probes: 100 of them, spread over the set, exchange 16-byte messages back to back, 2 ms apart, throughout; a probe's
// pause is its longest wait for an echo while the hand-over ran (its p99 over the probes is quoted). Each TCP
// connection costs the daemon two descriptors and this machine allows 20,000 per process, so 9,000 is the most one
// daemon can hold here; the echo server runs in its own process for the same reason.
import { fork, spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { connect as tcpConnect, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { createInterface } from 'node:readline';
import { DAEMON_NODE_FLAGS } from './daemon-flags.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const repo = join(here, '..');
const SLEEP_IP = '127.50.27.10';
const SERVER = { host: '127.50.27.90', port: 9000 };
const admin = (k) => `127.50.27.${200 + k}`;

if (process.argv[2] === '--echo-server') {
  // The child: an echo server that lets half-closed connections stay half-open.
  const server = createServer({ allowHalfOpen: true }, (s) => {
    s.on('error', () => undefined);
    s.pipe(s);
  });
  server.listen(SERVER.port, SERVER.host, () => process.send?.('listening'));
} else {
  await main();
}

async function main() {
  const { values: opts } = parseArgs({
    options: {
      connections: { type: 'string', default: '9000' },
      probes: { type: 'string', default: '100' },
      rounds: { type: 'string', default: '3' },
      json: { type: 'string' },
      hbone: { type: 'boolean', default: false },
    },
  });
  const n = Number(opts.connections);
  const probes = Math.min(Number(opts.probes), n);
  const tmp = mkdtempSync(join(tmpdir(), 'ztn-handover-bench-'));
  const kids = new Set();
  const cleanup = () => {
    for (const k of kids) k.kill('SIGKILL');
    rmSync(tmp, { recursive: true, force: true });
  };
  process.on('exit', cleanup);
  const echo = fork(fileURLToPath(import.meta.url), ['--echo-server'], { stdio: 'ignore' });
  kids.add(echo);
  await new Promise((r) => echo.once('message', r));
  const config = join(tmp, 'local.yaml');
  const store = `- {uid: u-store, name: store, namespace: default, serviceAccount: store, workloadIps: ["${SERVER.host}"], protocol: HBONE, node: node-b}\n`;
  writeFileSync(config, `workloads:\n- {uid: u-sleep, name: sleep, namespace: default, serviceAccount: sleep, workloadIps: ["${SLEEP_IP}"], protocol: HBONE, node: node-a}\n${opts.hbone ? store : ''}`);
  const env = (k, node = 'node-a') => ({
    PATH: process.env.PATH, HOME: process.env.HOME ?? '/tmp',
    PROXY_MODE: 'local', NODE_NAME: node, LOCAL_XDS_PATH: config, LOCAL_CA_DIR: join(tmp, 'ca'),
    ADMIN_ADDR: `${admin(k)}:15000`, STATS_ADDR: `${admin(k)}:15020`, READINESS_ADDR: `${admin(k)}:15021`,
    HANDOVER_SOCKET: join(tmp, `handover-${node}.sock`), LOG_FORMAT: 'json', RUST_LOG: 'info,access=warn',
    XDS_ADDRESS: '', CA_ADDRESS: '', CONNECTION_TERMINATION_DEADLINE: '5s',
  });
  const rounds = [];
  let k = 0;
  let current = await startDaemon(env(k++), kids);
  const destination = opts.hbone ? await startDaemon(env(50, 'node-b'), kids) : null;
  const conns = [];
  for (let i = 0; i < n; i += 200) {
    conns.push(...(await Promise.all(Array.from({ length: Math.min(200, n - i) }, () => open()))));
  }
  console.log(`${n} connections established through one daemon`);
  for (let round = 0; round < Number(opts.rounds); round++) {
    // Spread over the whole set (every (n / probes)-th): the order in which a hand-over pauses, sends and resumes
    // connections follows the order they were opened in, so the first ones opened would see only the best case.
    const probing = Array.from({ length: probes }, (_, i) => conns[Math.floor((i * n) / probes)]).map((c) => probe(c));
    await sleep(300);
    const started = performance.now();
    const next = await startDaemon(env(k++), kids);
    const readyMs = performance.now() - started;
    const exit = await Promise.race([current.exited, sleep(20_000).then(() => null)]);
    await sleep(300);
    const gaps = await Promise.all(probing.map((p) => p.stop()));
    const given = current.logs.find((l) => l.message === 'hand-over given') ?? null;
    const taken = next.logs.find((l) => l.message === 'hand-over taken') ?? null;
    const lost = await checkAll(conns);
    gaps.sort((a, b) => a - b);
    const r = {
      round: round + 1,
      mode: opts.hbone ? 'hbone' : 'tcp',
      connections: n,
      given: given?.connections ?? 0,
      taken: taken?.connections ?? 0,
      kept: given?.kept ?? null,
      giveMs: given?.durationMs ?? null,
      takeMs: taken?.durationMs ?? null,
      pauseMs: given?.pauseMs ?? null,
      phasesMs: given?.phasesMs ?? null,
      probeGapP50Ms: round1(gaps[Math.floor(gaps.length * 0.5)]),
      probeGapP99Ms: round1(gaps[Math.min(gaps.length - 1, Math.floor(gaps.length * 0.99))]),
      probeGapMaxMs: round1(gaps[gaps.length - 1]),
      lost,
      predecessorExit: exit?.code ?? 'still running',
      successorReadyMs: Math.round(readyMs),
    };
    rounds.push(r);
    console.log(JSON.stringify(r));
    current = next;
  }
  for (const c of conns) c.destroy();
  for (const d of [current, destination].filter(Boolean)) {
    d.child.kill('SIGTERM');
    await d.exited;
  }
  if (opts.json) writeFileSync(opts.json, `${JSON.stringify({ date: new Date().toISOString(), node: process.version, rounds }, null, 2)}\n`);
  process.exit(0);
}

function round1(x) {
  return x === undefined ? null : Math.round(x * 10) / 10;
}

function sleep(ms) {
  return new Promise((r) => setTimeout(r, ms));
}

async function startDaemon(env, kids) {
  const child = spawn(process.execPath, [...DAEMON_NODE_FLAGS, join(repo, 'bin', 'ztunnel-node.js'), 'proxy'], { env, stdio: ['ignore', 'pipe', 'inherit'] });
  kids.add(child);
  const logs = [];
  createInterface({ input: child.stdout }).on('line', (l) => {
    if (l.startsWith('{')) {
      try {
        logs.push(JSON.parse(l));
      } catch {
        // not a record
      }
    }
  });
  const exited = new Promise((r) => child.once('exit', (code, signal) => (kids.delete(child), r({ code, signal }))));
  const url = `http://${env.READINESS_ADDR}/healthz/ready`;
  for (let i = 0; i < 600; i++) {
    const ok = await fetch(url).then((r) => r.status === 200, () => false);
    if (ok) return { child, logs, exited };
    await sleep(50);
  }
  throw new Error('the daemon did not become ready');
}

/** A SOCKS5 CONNECT to the echo server; resolves the socket, paused. */
function open() {
  return new Promise((resolve, reject) => {
    const s = tcpConnect({ host: SLEEP_IP, port: 15080 });
    let buf = Buffer.alloc(0);
    s.once('connect', () => {
      s.write(Buffer.from([5, 1, 0]));
      const ip = SERVER.host.split('.').map(Number);
      s.write(Buffer.from([5, 1, 0, 1, ...ip, SERVER.port >> 8, SERVER.port & 255]));
    });
    s.on('error', reject);
    const onData = (d) => {
      buf = Buffer.concat([buf, d]);
      if (buf.length >= 12) {
        s.off('data', onData);
        if (buf[3] !== 0) return reject(new Error(`SOCKS5 reply ${buf[3]}`));
        s.pause();
        resolve(s);
      }
    };
    s.on('data', onData);
  });
}

/** Back-to-back 16-byte exchanges on `s`, 2 ms apart; `stop()` resolves the longest wait for an echo, ms. */
function probe(s) {
  let running = true;
  let longest = 0;
  const done = (async () => {
    s.resume();
    let pending = null;
    s.on('data', (d) => pending?.(d));
    let i = 0;
    while (running) {
      const msg = Buffer.from(`p${String(i++).padStart(15, '0')}`);
      const t0 = performance.now();
      let got = Buffer.alloc(0);
      await new Promise((r) => {
        pending = (d) => {
          got = Buffer.concat([got, d]);
          if (got.length >= 16) r();
        };
        s.write(msg);
      });
      if (!got.subarray(0, 16).equals(msg)) throw new Error('a probe got back other bytes');
      longest = Math.max(longest, performance.now() - t0);
      await sleep(2);
    }
    s.removeAllListeners('data');
    s.pause();
  })();
  return {
    stop: async () => {
      running = false;
      await done;
      return longest;
    },
  };
}

/** Every connection echoes one tagged message; resolves how many did not (within 20 s). */
async function checkAll(conns) {
  let lost = 0;
  for (let i = 0; i < conns.length; i += 500) {
    const batch = conns.slice(i, i + 500);
    const results = await Promise.all(
      batch.map(
        (s, j) =>
          new Promise((resolve) => {
            const msg = Buffer.from(`c${String(i + j).padStart(15, '0')}`);
            let got = Buffer.alloc(0);
            const timer = setTimeout(() => finish(false), 20_000);
            const onData = (d) => {
              got = Buffer.concat([got, d]);
              if (got.length >= 16) finish(got.subarray(0, 16).equals(msg));
            };
            const finish = (ok) => {
              clearTimeout(timer);
              s.off('data', onData);
              s.pause();
              resolve(ok);
            };
            s.on('data', onData);
            s.resume();
            s.write(msg);
          }),
      ),
    );
    lost += results.filter((ok) => !ok).length;
  }
  return lost;
}
