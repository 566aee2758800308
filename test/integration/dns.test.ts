// The DNS proxy (15053) of a local-mode daemon, asked by real resolver clients: dnspython (test/helpers/dns_query.py)
// for exact answers and flags, `dig` as an operator would, and raw sockets for the malformed and oversized. Every
// rule of ztunnel's name matching is asked over UDP and TCP. The upstream side (forwarding, an upstream that never
// answers, TC from upstream) needs port 53 and lives in the namespace suite (test/netns/dns.test.ts); here the
// daemon's resolver file names no server, so forwarded questions must fail cleanly (SERVFAIL, counted).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { createSocket } from 'node:dgram';
import { connect, type Socket } from 'node:net';
import { readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { sumSamples } from '../../dist/cli/prom-text.js';
import { ROOT, makeTempDir, removeTempDir, startDaemon, workload, type Daemon } from '../helpers/daemon.js';
import { BLOCKS, block, waitFor } from '../helpers/net.js';
import { PYTHON, skipWithoutCommand, skipWithoutPython } from '../helpers/prereqs.js';

const run = promisify(execFile);
/** dnspython asks most questions; `dig` asks as an operator would. */
const NO_DNSPYTHON = skipWithoutPython('dnspython');
const NO_DIG = skipWithoutCommand('dig');
const net = block(BLOCKS.dns);
const SLEEP_IP = net.workload(1); // client in namespace default
const OTHER_IP = '127.67.1.11'; // client in namespace other
const DNS_PORT = 15053;
const HEADLESS_ENDPOINTS = 40; // 40 A records do not fit 512 bytes
const vip = (k: number) => `127.67.100.${k}`;
const V6_VIP = 'fd00:67::10';

const endpoints = Array.from({ length: HEADLESS_ENDPOINTS }, (_, i) =>
  workload({
    name: `db-${i}`,
    ip: `127.67.2.${i + 1}`,
    node: 'node-b',
    services: { 'default/db.default.svc.cluster.local': { 5432: 5432 } },
  }),
);

const CONFIG = {
  workloads: [
    workload({ name: 'sleep', ip: SLEEP_IP, node: 'node-a' }),
    workload({ name: 'curl', namespace: 'other', ip: OTHER_IP, node: 'node-a' }),
    workload({ name: 'echo', ip: '127.67.3.10', node: 'node-b', services: { 'default/echo.default.svc.cluster.local': { 80: 8080 } } }),
    ...endpoints,
  ],
  services: [
    { name: 'echo', namespace: 'default', hostname: 'echo.default.svc.cluster.local', vips: [`/${vip(1)}`, `/${V6_VIP}`], ports: { 80: 8080 } },
    // Headless: no VIP, answered with its endpoints' addresses.
    { name: 'db', namespace: 'default', hostname: 'db.default.svc.cluster.local', ports: { 5432: 5432 } },
    // No VIP and not a Kubernetes hostname: not ours to answer.
    { name: 'novip', namespace: 'default', hostname: 'novip.example.com', ports: { 80: 80 } },
    // Only its own namespace may resolve it.
    { name: 'secret', namespace: 'other', hostname: 'secret.other.svc.cluster.local', vips: [`/${vip(2)}`], ports: { 80: 80 }, visibility: 'Namespace' },
    // ServiceEntry-style hosts: a wildcard and an external name.
    { name: 'wild', namespace: 'default', hostname: '*.wild.example.com', vips: [`/${vip(3)}`], ports: { 443: 443 } },
    { name: 'ext', namespace: 'default', hostname: 'www.example.org', vips: [`/${vip(4)}`], ports: { 443: 443 } },
    // One hostname in two namespaces: each client gets its own namespace's.
    { name: 'shared', namespace: 'default', hostname: 'shared.example.com', vips: [`/${vip(5)}`], ports: { 80: 80 } },
    { name: 'shared', namespace: 'other', hostname: 'shared.example.com', vips: [`/${vip(6)}`], ports: { 80: 80 } },
    // IPv6 only: an A question finds the name but no records.
    { name: 'v6only', namespace: 'default', hostname: 'v6only.default.svc.cluster.local', vips: [`/${'fd00:67::20'}`], ports: { 80: 80 }, ipFamilies: 'IPv6' },
    // A VIP on another network is not callable from the client's.
    { name: 'remote', namespace: 'default', hostname: 'remote.default.svc.cluster.local', vips: [`far/${vip(7)}`], ports: { 80: 80 } },
  ],
};

let d: Daemon;
let caDir: string;
let dir: string;

before(async () => {
  caDir = makeTempDir('ztn-dns-ca-');
  dir = makeTempDir('ztn-dns-');
  const resolvConf = join(dir, 'resolv.conf');
  writeFileSync(resolvConf, '# no upstream: forwarded questions must fail cleanly\nsearch example.internal\n');
  d = await startDaemon({ node: 'node-a', config: CONFIG, caDir, adminIp: net.admin(1), env: { DNS_RESOLV_CONF: resolvConf, RUST_LOG: 'info,dns=debug' } });
});

after(async () => {
  await d?.stop();
  removeTempDir(caDir);
  removeTempDir(dir);
});

/** A question to dns_query.py. */
interface DnsQuestion {
  server: string;
  port: number;
  name: string;
  type: string;
  tcp?: boolean;
  /** The EDNS payload size; absent: no EDNS. */
  payload?: number;
  ednsVersion?: number;
  /** Seconds. */
  timeout?: number;
  /** The address to ask from. */
  source?: string;
}

/** One answer of dns_query.py (`error` alone when the question failed). */
interface DnsAnswer {
  rcode: string;
  tc: boolean;
  aa: boolean;
  ra: boolean;
  answers: { name: string; type: string; ttl: number; data: string }[];
  edns: { payload: number; version: number } | null;
  error?: string;
}

/** Ask with dnspython: one python process for a list of questions. */
async function ask(questions: DnsQuestion[]): Promise<DnsAnswer[]> {
  const { stdout } = await run(PYTHON, [join(ROOT, 'test/helpers/dns_query.py'), JSON.stringify(questions)], { timeout: 30_000 });
  return JSON.parse(stdout) as DnsAnswer[];
}

const q = (name: string, extra: Partial<DnsQuestion> = {}): DnsQuestion =>
  ({ server: SLEEP_IP, port: DNS_PORT, name, type: 'A', ...extra });
const data = (r: DnsAnswer) => r.answers.map((a) => `${a.type} ${a.name} ${a.data}`).sort();

for (const tcp of [false, true]) {
  const proto = tcp ? 'TCP' : 'UDP';

  test(`${proto}: a service by FQDN, by name.namespace, by short name (search aliases), TTL 30, authoritative`, { skip: NO_DNSPYTHON }, async () => {
    const [fqdn, dotted, short, svc] = await ask([
      q('echo.default.svc.cluster.local.', { tcp }),
      q('echo.default.', { tcp }),
      q('echo.', { tcp }),
      q('echo.default.svc.', { tcp }),
    ]);
    for (const r of [fqdn, dotted, short, svc]) {
      assert.equal(r.rcode, 'NOERROR');
      assert.equal(r.aa, true);
      assert.equal(r.tc, false);
      assert.deepEqual(r.answers.map((a) => [a.type, a.data, a.ttl]), [['A', vip(1), 30]]);
    }
    assert.equal(fqdn.answers[0].name, 'echo.default.svc.cluster.local.');
    assert.equal(short.answers[0].name, 'echo.', 'the record is named as asked');
  });

  test(`${proto}: through a stripped search domain, a CNAME to the resolvable FQDN, then its A`, { skip: NO_DNSPYTHON }, async () => {
    const [viaNs, viaSvc, external] = await ask([
      q('echo.default.default.svc.cluster.local.', { tcp }),
      q('echo.default.svc.cluster.local.svc.cluster.local.', { tcp }),
      q('www.example.org.default.svc.cluster.local.', { tcp }),
    ]);
    assert.deepEqual(data(viaNs), ['A echo.default.svc.cluster.local. ' + vip(1), 'CNAME echo.default.default.svc.cluster.local. echo.default.svc.cluster.local.']);
    assert.deepEqual(data(viaSvc), ['A echo.default.svc.cluster.local. ' + vip(1), 'CNAME echo.default.svc.cluster.local.svc.cluster.local. echo.default.svc.cluster.local.']);
    assert.deepEqual(data(external), ['A www.example.org. ' + vip(4), 'CNAME www.example.org.default.svc.cluster.local. www.example.org.']);
  });

  test(`${proto}: wildcards, headless endpoints, visibility, namespace preference, networks, families`, { skip: NO_DNSPYTHON }, async () => {
    const [wild, deepWild, headless, hiddenFromDefault, seenInOther, sharedDefault, sharedOther, v6A, v6AAAA, dualAAAA, remote] = await ask([
      q('api.wild.example.com.', { tcp }),
      q('a.b.wild.example.com.', { tcp }),
      q('db.default.svc.cluster.local.', { tcp, payload: 4096 }),
      q('secret.other.svc.cluster.local.', { tcp }),
      q('secret.other.svc.cluster.local.', { tcp, server: OTHER_IP }),
      q('shared.example.com.', { tcp }),
      q('shared.example.com.', { tcp, server: OTHER_IP }),
      q('v6only.default.svc.cluster.local.', { tcp }),
      q('v6only.default.svc.cluster.local.', { tcp, type: 'AAAA' }),
      q('echo.default.svc.cluster.local.', { tcp, type: 'AAAA' }),
      q('remote.default.svc.cluster.local.', { tcp }),
    ]);
    assert.deepEqual(data(wild), [`A api.wild.example.com. ${vip(3)}`]);
    assert.deepEqual(data(deepWild), [`A a.b.wild.example.com. ${vip(3)}`]);
    assert.equal(headless.rcode, 'NOERROR');
    assert.deepEqual(headless.answers.map((a) => a.data).sort(), endpoints.map((w) => w.workloadIps[0]).sort(), 'every endpoint of the headless service');
    // Hidden: not ours to answer, so it is forwarded, and this daemon has no upstream.
    assert.equal(hiddenFromDefault.rcode, 'SERVFAIL');
    assert.deepEqual(data(seenInOther), [`A secret.other.svc.cluster.local. ${vip(2)}`]);
    assert.deepEqual(data(sharedDefault), [`A shared.example.com. ${vip(5)}`]);
    assert.deepEqual(data(sharedOther), [`A shared.example.com. ${vip(6)}`]);
    for (const empty of [v6A, remote]) {
      assert.equal(empty.rcode, 'NOERROR', 'found without records is NOERROR, not NXDOMAIN');
      assert.equal(empty.aa, true);
      assert.deepEqual(empty.answers, []);
    }
    assert.deepEqual(data(v6AAAA), ['AAAA v6only.default.svc.cluster.local. fd00:67::20']);
    assert.deepEqual(data(dualAAAA), [`AAAA echo.default.svc.cluster.local. ${V6_VIP}`]);
  });

  test(`${proto}: matching ignores case and the answer keeps the question's`, { skip: NO_DNSPYTHON }, async () => {
    const [r] = await ask([q('EcHo.DeFault.SVC.cluster.LOCAL.', { tcp })]);
    assert.deepEqual(data(r), [`A EcHo.DeFault.SVC.cluster.LOCAL. ${vip(1)}`]);
  });

  test(`${proto}: what the mesh does not answer is forwarded: with no upstream, SERVFAIL (novip, MX, unknown names)`, { skip: NO_DNSPYTHON }, async () => {
    const rs = await ask([q('novip.example.com.', { tcp }), q('echo.default.svc.cluster.local.', { tcp, type: 'MX' }), q('nothing.example.', { tcp })]);
    for (const r of rs) {
      assert.equal(r.rcode, 'SERVFAIL', JSON.stringify(r));
      assert.equal(r.aa, false);
    }
  });

  test(`${proto}: RFC 6761's special-use names are answered here, never forwarded (as ztunnel's resolver does)`, { skip: NO_DNSPYTHON }, async () => {
    const [v4, v6, sub, mx, ptr, invalid] = await ask([
      q('localhost.', { tcp }),
      q('localhost.', { tcp, type: 'AAAA' }),
      q('db.LocalHost.', { tcp }),
      q('localhost.', { tcp, type: 'MX' }),
      q('1.0.0.127.in-addr.arpa.', { tcp, type: 'PTR' }),
      q('nothing.invalid.', { tcp }),
    ]);
    assert.deepEqual([data(v4), data(v6), data(sub)], [['A localhost. 127.0.0.1'], ['AAAA localhost. ::1'], ['A db.LocalHost. 127.0.0.1']]);
    assert.deepEqual([mx.rcode, mx.answers], ['NOERROR', []], 'other types: no records');
    assert.deepEqual(data(ptr), ['PTR 1.0.0.127.in-addr.arpa. localhost.']);
    assert.equal(invalid.rcode, 'NXDOMAIN');
  });
}

test('UDP without EDNS: an answer over 512 bytes comes back as the question alone with TC; TCP and EDNS carry it whole', { skip: NO_DNSPYTHON }, async () => {
  const [plain, edns, tcp] = await ask([
    q('db.default.svc.cluster.local.'),
    q('db.default.svc.cluster.local.', { payload: 4096 }),
    q('db.default.svc.cluster.local.', { tcp: true }),
  ]);
  assert.equal(plain.tc, true);
  assert.deepEqual(plain.answers, []);
  assert.equal(plain.edns, null, 'no OPT to a query without one');
  assert.equal(edns.tc, false);
  assert.equal(edns.answers.length, HEADLESS_ENDPOINTS);
  assert.deepEqual(edns.edns, { payload: 1232, version: 0 }, 'an EDNS query gets an OPT with our payload size');
  assert.equal(tcp.tc, false);
  assert.equal(tcp.answers.length, HEADLESS_ENDPOINTS);
});

test('EDNS version 1 gets BADVERS with an OPT (RFC 6891 6.1.3)', { skip: NO_DNSPYTHON }, async () => {
  const [r] = await ask([q('echo.default.svc.cluster.local.', { payload: 1232, ednsVersion: 1 })]);
  assert.equal(r.rcode, 'BADVERS');
  assert.equal(r.edns?.version, 0);
  assert.deepEqual(r.answers, []);
});

test('dig, as an operator would ask, over UDP and TCP', { skip: NO_DIG }, async () => {
  for (const extra of [[], ['+tcp']]) {
    const { stdout } = await run('dig', ['+noall', '+answer', '+comments', '-p', String(DNS_PORT), `@${SLEEP_IP}`, 'echo.default.svc.cluster.local', 'A', ...extra]);
    assert.match(stdout, /status: NOERROR/);
    assert.match(stdout, /flags: qr aa rd ra/);
    assert.match(stdout, new RegExp(`^echo\\.default\\.svc\\.cluster\\.local\\.\\s+30\\s+IN\\s+A\\s+${vip(1).replaceAll('.', '\\.')}$`, 'm'));
  }
});

test('a headless service\'s pod by its own name, and SRV from the mesh\'s ports (dig, with its additional section)', { skip: NO_DIG }, async () => {
  const dig = async (...args: string[]) => (await run('dig', ['+noall', '+answer', '+additional', '+comments', '-p', String(DNS_PORT), `@${SLEEP_IP}`, ...args])).stdout;
  // <pod>.<service>.<ns>.svc.<domain>: that endpoint alone (ztunnel forwards these).
  const pod = await dig('db-3.db.default.svc.cluster.local', 'A');
  assert.match(pod, /status: NOERROR/);
  assert.match(pod, /flags: qr aa rd ra/);
  assert.match(pod, /^db-3\.db\.default\.svc\.cluster\.local\.\s+30\s+IN\s+A\s+127\.67\.2\.4$/m);
  assert.equal(pod.match(/\sIN\s+A\s/g)!.length, 1);
  assert.match(await dig('db-99.db.default.svc.cluster.local', 'A'), /status: SERVFAIL/, 'no such endpoint: forwarded (no upstream here)');
  // A service with a VIP: one record per port, the target its name, the VIPs as additional records.
  const echo = await dig('echo.default.svc.cluster.local', 'SRV');
  assert.match(echo, /^echo\.default\.svc\.cluster\.local\.\s+30\s+IN\s+SRV\s+0 100 80 echo\.default\.svc\.cluster\.local\.$/m);
  assert.match(echo, new RegExp(`^echo\\.default\\.svc\\.cluster\\.local\\.\\s+30\\s+IN\\s+A\\s+${vip(1).replaceAll('.', '\\.')}$`, 'm'));
  assert.match(echo, new RegExp(`IN\\s+AAAA\\s+${V6_VIP}$`, 'm'));
  // Headless: every endpoint by its pod name at its target port, over TCP (too large for 512 bytes).
  const db = await dig('db.default.svc.cluster.local', 'SRV', '+tcp');
  assert.equal(db.match(/\sIN\s+SRV\s+0 2 5432 db-\d+\.db\.default\.svc\.cluster\.local\.$/gm)!.length, HEADLESS_ENDPOINTS);
  assert.match(db, /^db-7\.db\.default\.svc\.cluster\.local\.\s+30\s+IN\s+A\s+127\.67\.2\.8$/m);
  // Port names are not in the mesh's state: Kubernetes' _<name>._<proto> form is forwarded.
  assert.match(await dig('_http._tcp.echo.default.svc.cluster.local', 'SRV'), /status: SERVFAIL/);
});

/** Send raw bytes over UDP; resolve the first reply, or null after `ms`. */
function udpRaw(bytes: Buffer, ms = 500): Promise<Buffer | null> {
  return new Promise((resolve) => {
    const s = createSocket('udp4');
    const timer = setTimeout(() => {
      s.close();
      resolve(null);
    }, ms);
    s.on('message', (m) => {
      clearTimeout(timer);
      s.close();
      resolve(m);
    });
    s.send(bytes, DNS_PORT, SLEEP_IP);
  });
}

function rss(pid: number | undefined): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return Number(m?.[1] ?? 0) * 1024;
}

test('malformed and oversized queries: FORMERR when the header is readable, silence otherwise, no crash, bounded memory', { skip: NO_DNSPYTHON }, async () => {
  // A header that promises a question and ends: FORMERR, id echoed.
  const header = Buffer.from([0xab, 0xcd, 0x01, 0x00, 0x00, 0x01, 0, 0, 0, 0, 0, 0]);
  const formerr = await udpRaw(header);
  assert.ok(formerr, 'a reply');
  assert.equal(formerr.readUInt16BE(0), 0xabcd);
  assert.equal(formerr[2] & 0x80, 0x80, 'QR set');
  assert.equal(formerr[3] & 0x0f, 1, 'RCODE FORMERR');
  // Too short to have a header, and a response sent to us: no reply.
  assert.equal(await udpRaw(Buffer.from([1, 2, 3])), null);
  assert.equal(await udpRaw(Buffer.from([0, 1, 0x81, 0x80, 0, 0, 0, 0, 0, 0, 0, 0])), null);
  // Oversized: a 60 KB datagram of garbage behind a query header.
  const big = Buffer.concat([header, Buffer.alloc(60_000, 0x41)]);
  const bigReply = await udpRaw(big);
  assert.ok(bigReply && (bigReply[3] & 0x0f) === 1, 'FORMERR for the oversized garbage');

  // A flood of garbage and of TCP connections that never finish a question.
  const before = rss(d.child.pid);
  const s = createSocket('udp4');
  for (let i = 0; i < 5_000; i++) s.send(i % 2 ? big : header, DNS_PORT, SLEEP_IP);
  const stalled: Socket[] = [];
  // Fewer than the server's TCP cap (128): the cap itself is checked below.
  for (let i = 0; i < 100; i++) {
    const c = connect(DNS_PORT, SLEEP_IP);
    c.on('error', () => {});
    c.on('connect', () => c.write(Buffer.from([0xff, 0xff, 1, 2])));
    stalled.push(c);
  }
  await new Promise((r) => setTimeout(r, 1500));
  s.close();
  const grown = rss(d.child.pid) - before;
  assert.ok(grown < 64 * 1024 * 1024, `RSS grew ${(grown / 2 ** 20).toFixed(1)} MiB under the flood`);
  // Still answering, over both transports, while the stalled connections hang.
  const [udp, tcp] = await ask([q('echo.default.svc.cluster.local.'), q('echo.default.svc.cluster.local.', { tcp: true })]);
  assert.deepEqual(data(udp), [`A echo.default.svc.cluster.local. ${vip(1)}`]);
  assert.deepEqual(data(tcp), [`A echo.default.svc.cluster.local. ${vip(1)}`]);
  // A TCP connection that sends nothing is closed by the server after its request timeout (5 s).
  const idle = connect(DNS_PORT, SLEEP_IP);
  const closedAfter = await new Promise<number>((resolve, reject) => {
    const t0 = Date.now();
    idle.on('error', reject);
    idle.on('close', () => resolve(Date.now() - t0));
  });
  assert.ok(closedAfter >= 4_000 && closedAfter < 9_000, `idle TCP closed after ${closedAfter} ms`);
  for (const c of stalled) c.destroy();
  assert.equal(d.exit, null, 'the daemon is still running');
});

test('DNS over TCP answers 99 % of questions while 300 slow clients hold connections on it (issue 29)', { skip: NO_DNSPYTHON }, async () => {
  const octet = SLEEP_IP.split('.')[1];
  let stop = false;
  const held = new Set<Socket>();
  const connected = new Set<number>();
  const open = (i: number) => {
    if (stop) return;
    const c = connect({ host: SLEEP_IP, port: DNS_PORT, localAddress: `127.${octet}.200.${1 + (i % 4)}` });
    held.add(c);
    c.on('error', () => {});
    c.on('connect', () => (connected.add(i), c.write(Buffer.from([0])))); // half a length prefix, never the rest
    c.on('close', () => {
      held.delete(c);
      // Re-opened 100 ms after it is closed: up to 3,000 connections a second (the attack re-opened 64 a
      // second); faster churn only fills the machine's TIME_WAIT table for the tests that follow.
      setTimeout(() => open(i), 100);
    });
  };
  for (let i = 0; i < 300; i++) open(i);
  try {
    // The questions start once every slow client has connected (and sent its half prefix).
    await waitFor(() => connected.size === 300, { timeoutMs: 10_000, message: 'the 300 slow clients connected' });
    const questions = Array.from({ length: 197 }, () => q('echo.default.svc.cluster.local.', { tcp: true, timeout: 2, source: `127.${octet}.201.1` }));
    const answers = await ask(questions);
    const answered = answers.filter((a) => a.rcode === 'NOERROR' && a.answers.length === 1).length;
    assert.ok(answered >= 195, `${answered} of 197 questions answered over TCP: ${JSON.stringify(answers.find((a) => a.error !== undefined))}`);
  } finally {
    stop = true;
    for (const c of held) c.destroy();
  }
});

test('a UDP flood of a mesh name at one workload\'s DNS proxy: another workload\'s questions are all answered, the flood is cut at its budget (issue 29)', { skip: NO_DNSPYTHON }, async () => {
  const before = await d.metric('ztunnel_node_dns_requests_dropped_total');
  // CPU seconds of the thread every DNS proxy runs on (the dataplane's control runtime).
  const controlCpu = () => {
    const tasks = `/proc/${d.child.pid}/task`;
    let ticks = 0;
    for (const t of readdirSync(tasks)) {
      const stat = readFileSync(`${tasks}/${t}/stat`, 'utf8');
      if (!stat.includes('(ztunnel-control')) continue;
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      ticks += Number(fields[11]) + Number(fields[12]); // utime, stime
    }
    return ticks / 100;
  };
  const cpu0 = controlCpu();
  const t0 = Date.now();
  // As fast as one Python process sends: well over the proxy's answers per second on one core.
  const flood = execFile(PYTHON, ['-c', `import socket, time, dns.message
q = dns.message.make_query("echo.default.svc.cluster.local.", "A").to_wire()
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.setblocking(False)
end = time.time() + 6
n = 0
while time.time() < end:
    for _ in range(256):
        try: s.sendto(q, ("${SLEEP_IP}", ${DNS_PORT})); n += 1
        except BlockingIOError: pass
        try: s.recv(2048)
        except BlockingIOError: pass
print(n)`]);
  let sent = '';
  flood.stdout!.on('data', (b: Buffer) => { sent += b; });
  const done = new Promise((resolve) => flood.on('exit', resolve));
  try {
    // The flood under way: the flooded proxy is over its budget and dropping.
    await waitFor(async () => (await d.metric('ztunnel_node_dns_requests_dropped_total')) > before, { timeoutMs: 5_000, message: 'the flood to be dropped over the budget' });
    const questions = Array.from({ length: 300 }, () => q('echo.default.svc.cluster.local.', { server: OTHER_IP, timeout: 1 }));
    const answers = await ask(questions);
    const answered = answers.filter((a) => a.rcode === 'NOERROR' && a.answers.length === 1).length;
    assert.ok(answered >= 297, `${answered} of 300 questions to the other workload's proxy answered: ${JSON.stringify(answers.find((a) => a.error !== undefined))}`);
  } finally {
    await done;
  }
  const share = (controlCpu() - cpu0) / ((Date.now() - t0) / 1000);
  const dropped = await d.metric('ztunnel_node_dns_requests_dropped_total') - before;
  console.log(`# flood: ${sent.trim()} questions sent in 6 s, ${dropped} dropped over the budget, control thread ${(share * 100).toFixed(0)} % of a core`);
  // Its budget of 10,000 answers a second took about a quarter of a core here; unbudgeted, the same flood took 53 %
  // (the rest of the machine was the sender's).
  assert.ok(share < 0.4, `the flood took ${(share * 100).toFixed(0)} % of the control thread`);
  assert.ok(dropped > 0, 'questions over the flooded proxy\'s budget are dropped and counted');
  // The flooded workload's own questions are answered again once the flood ends.
  const [after] = await ask([q('echo.default.svc.cluster.local.', { timeout: 2 })]);
  assert.equal(after.rcode, 'NOERROR');
});

test('metrics: istio_dns_requests_total and upstream counters with ztunnel labels; debug records on target dns', { skip: NO_DNSPYTHON }, async () => {
  const samples = await d.metrics();
  const labels = { request_query_type: 'a', request_protocol: 'udp', source_canonical_service: 'sleep', source_canonical_revision: 'v1' };
  assert.ok(sumSamples(samples, 'istio_dns_requests_total', labels) >= 10);
  assert.ok(sumSamples(samples, 'istio_dns_requests_total', { ...labels, request_protocol: 'tcp' }) >= 10);
  const mx = { ...labels, request_query_type: 'mx' };
  assert.equal(sumSamples(samples, 'istio_dns_upstream_requests_total', mx), 1);
  assert.equal(sumSamples(samples, 'istio_dns_upstream_failures_total', mx), 1);
  assert.equal(sumSamples(samples, 'istio_dns_upstream_request_duration_seconds_count', mx), 1);
  assert.equal(sumSamples(samples, 'istio_dns_upstream_request_duration_seconds_bucket', { ...mx, le: '+Inf' }), 1);
  const rec = d.logs.find((l) => l.target === 'dns' && l.domain === 'echo.default.svc.cluster.local.' && l.result === 'success');
  assert.ok(rec, 'a dns debug record');
  assert.equal(rec['src.workload'], 'sleep');
  assert.equal(rec['src.namespace'], 'default');
  assert.equal(rec.query, 'A');
  assert.equal(rec.endpoints, 1);
});
