// Writes the seed corpora (fuzz/corpus/<target>/<seed>): small inputs that each mean something (a request of each
// kind, each refusal the code has a branch for, the edges of a length), so that a short CI run starts from every
// branch instead of finding them again. Inputs the fuzzer found and that were kept live beside these under other
// names; this script only rewrites its own. Run: node fuzz/seeds.mjs
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const corpus = join(dirname(fileURLToPath(import.meta.url)), 'corpus');
const bytes = (...parts) => Buffer.concat(parts.map((p) => (Buffer.isBuffer(p) ? p : Buffer.from(p))));
function seeds(target, entries) {
  mkdirSync(join(corpus, target), { recursive: true });
  for (const [name, data] of Object.entries(entries)) writeFileSync(join(corpus, target, name), data);
}

// Protocol buffers, just what the seeds need: varints, and length-delimited fields (strings, bytes, messages).
function varint(n) {
  const out = [];
  let v = BigInt(n);
  if (v < 0n) v += 1n << 64n;
  do {
    const b = Number(v & 0x7fn);
    v >>= 7n;
    out.push(v ? b | 0x80 : b);
  } while (v);
  return Buffer.from(out);
}
const num = (field, n) => bytes(varint(field << 3), varint(n));
const len = (field, v) => {
  const b = Buffer.isBuffer(v) ? v : Buffer.from(v);
  return bytes(varint((field << 3) | 2), varint(b.length), b);
};
const msg = (...fields) => bytes(...fields);
const ip4 = (s) => Buffer.from(s.split('.').map(Number));
const ip6 = (groups) => Buffer.from(groups.flatMap((g) => [g >> 8, g & 0xff]));

// WDS: envoy Resource { version 1, resource 2: Any { type_url 1, value 2 }, name 3 } around istio.workload.Address
// { workload 1 | service 2 } (field numbers: native/dataplane/src/state/wds.rs, Istio's).
const ADDRESS = 'type.googleapis.com/istio.workload.Address';
const resource = (name, body, typeUrl = ADDRESS) => msg(len(1, 'v1'), len(2, msg(len(1, typeUrl), len(2, body))), len(3, name));
const port = (s, t) => msg(num(1, s), num(2, t));
const hostnameGw = (ns, host, p) => msg(len(1, msg(len(1, ns), len(2, host))), num(3, p));
const addressGw = (net, ip, p) => msg(len(2, msg(len(1, net), len(2, ip))), num(3, p));
const echoWorkload = msg(
  len(1, 'echo-1'), len(2, 'default'), len(3, ip4('10.0.0.1')), num(5, 1), len(6, 'cluster.local'), len(7, 'echo'),
  len(9, 'node-1'), len(10, 'echo'), len(11, 'v1'), num(12, 2), len(13, 'echo'), len(20, 'Kubernetes//Pod/default/echo-1'),
  len(22, msg(len(1, 'default/echo.default.svc.cluster.local'), len(2, msg(len(1, port(80, 8080)))))),
);
const richWorkload = msg(
  len(1, 'app-0'), len(2, 'prod'), len(3, ip4('10.0.0.2')), len(3, ip6([0xfd00, 0, 0, 0, 0, 0, 0, 2])), len(4, 'net-1'),
  num(5, 1), len(6, 'example.org'), len(7, 'app'), len(8, hostnameGw('istio-system', 'waypoint.prod.svc.cluster.local', 15008)),
  len(9, 'node-2'), len(16, 'prod/allow-all'), num(17, 1), len(18, 'Kubernetes'),
  len(19, addressGw('net-2', ip4('192.168.0.1'), 15008)), len(20, 'Kubernetes//Pod/prod/app-0'), len(21, 'app-0.example.org'),
  len(23, msg(num(1, 1), num(2, 8443))), len(24, msg(len(1, 'us-east'), len(2, 'us-east-1a'), len(3, 'rack-4'))),
  num(25, 1), len(27, msg(num(1, 3))),
);
const echoService = msg(
  len(1, 'echo'), len(2, 'default'), len(3, 'echo.default.svc.cluster.local'), len(4, msg(len(1, ''), len(2, ip4('10.96.0.10')))),
  len(5, port(80, 8080)), len(5, port(443, 0)), len(6, 'spiffe://cluster.local/ns/default/sa/echo'),
);
const richService = msg(
  len(1, 'api'), len(2, 'prod'), len(3, 'api.example.com'),
  len(4, msg(len(1, 'net-1'), len(2, ip6([0xfd00, 0, 0, 0, 0, 0, 0x96, 1])))),
  len(4, msg(len(1, 'net-1'), len(2, ip4('10.200.0.0')), num(3, 16))), len(5, port(8080, 80)),
  len(7, addressGw('', ip4('10.96.0.20'), 15008)), len(8, msg(len(1, bytes(varint(1), varint(2), varint(4))), num(2, 2), num(3, 1))),
  num(9, 3), num(11, 1), len(13, msg(len(1, hostnameGw('istio-system', 'wp-b.istio-system.svc.cluster.local', 15008)), num(2, 30))),
  num(14, 1),
);
seeds('wds', {
  'resource-workload': resource('Kubernetes//Pod/default/echo-1', msg(len(1, echoWorkload))),
  'resource-workload-rich': resource('Kubernetes//Pod/prod/app-0', msg(len(1, richWorkload))),
  'resource-service': resource('default/echo.default.svc.cluster.local', msg(len(2, echoService))),
  'resource-service-rich': resource('prod/api.example.com', msg(len(2, richService))),
  'resource-other-type': resource('x', msg(len(1, echoWorkload)), 'type.googleapis.com/istio.security.Authorization'),
  'resource-no-body': msg(len(1, 'v1'), len(3, 'x')),
  'resource-empty-address': resource('x', Buffer.alloc(0)),
  'body-workload': msg(len(1, echoWorkload)),
  'body-service': msg(len(2, echoService)),
  'body-workload-ip-3-bytes': msg(len(1, msg(len(1, 'w'), len(2, 'ns'), len(3, Buffer.from([10, 0, 0])), len(20, 'w')))),
  'body-service-port-70000': msg(len(2, msg(len(1, 's'), len(2, 'ns'), len(3, 's.ns.svc'), len(5, port(70000, 80))))),
  'body-service-namespace-slash': msg(len(2, msg(len(1, 's'), len(2, 'a/b'), len(3, 'h'), len(4, msg(len(2, ip4('10.1.1.1'))))))),
});

// CONNECT :authority, as text.
seeds('authority', Object.fromEntries(Object.entries({
  'ipv4': '10.0.0.1:8080',
  'ipv6': '[fd00::1]:443',
  'ipv6-mapped': '[::ffff:10.0.0.1]:80',
  'ipv6-scope': '[fe80::1%2]:80',
  'hostname': 'echo.default.svc.cluster.local:80',
  'hostname-underscore': 'my_svc.example:9090',
  'port-zero': '10.0.0.1:0',
  'port-too-big': 'host:65536',
  'port-leading-zero': 'host:080',
  'no-port': 'echo.default',
  'no-host': ':80',
  'bad-host': 'ex ample:80',
  'port-plus-sign': '10.0.0.1:+80',
}).map(([k, v]) => [k, Buffer.from(v)])));

// SOCKS5 (RFC 1928): greeting (VER NMETHODS METHODS), then VER CMD RSV ATYP DST.ADDR DST.PORT.
const greet = bytes([5, 1, 0]);
const req = (atyp, addr, p = 80) => bytes([5, 1, 0, atyp], addr, [p >> 8, p & 0xff]);
const name = (s) => bytes([s.length], Buffer.from(s));
seeds('socks5', {
  'connect-ipv4': bytes(greet, req(1, ip4('10.0.0.1'))),
  'connect-ipv6': bytes(greet, req(4, ip6([0xfd00, 0, 0, 0, 0, 0, 0, 1]), 443)),
  'connect-name': bytes(greet, req(3, name('echo.default.svc.cluster.local'))),
  'connect-then-data': bytes(greet, req(1, ip4('10.0.0.1')), 'GET / HTTP/1.1\r\n\r\n'),
  'three-methods': bytes([5, 3, 2, 1, 0], req(1, ip4('127.0.0.1'), 8080)),
  'no-acceptable-method': bytes([5, 2, 1, 2]),
  'bind-command': bytes(greet, [5, 2, 0, 1], ip4('10.0.0.1'), [0, 80]),
  'address-type-5': bytes(greet, [5, 1, 0, 5, 0, 0]),
  'port-zero': bytes(greet, req(1, ip4('10.0.0.1'), 0)),
  'name-bad-chars': bytes(greet, req(3, name('a b/c'))),
  'name-empty': bytes(greet, req(3, name(''))),
  'socks4': bytes([4, 1, 0, 80], ip4('10.0.0.1'), [0]),
  'truncated-request': bytes(greet, [5, 1, 0, 1, 10, 0]),
});

// ZDS: records [control, length, bytes] (fuzz_targets/zds.rs). WorkloadRequest { add 1, del 2, snapshot_sent 3,
// keep 5 }; AddWorkload { uid 1, workload_info 2: { name 1, namespace 2, service_account 3 } }; DelWorkload { uid 2 };
// KeepWorkload { uid 1 }.
const info = (uid) => msg(len(1, `pod-${uid}`), len(2, 'ns1'), len(3, 'sa1'));
const zadd = (uid) => len(1, msg(len(1, uid), len(2, info(uid))));
const zkeep = (uid) => len(5, msg(len(1, uid)));
const zdel = (uid) => len(2, msg(len(2, uid)));
const zsnap = len(3, Buffer.alloc(0));
const FD_A = 1, FD_B = 1 | 4, TWO_FDS = 2, PAD = 0x10;
const rec = (control, b) => bytes([control, b.length], b);
seeds('zds', {
  'add-snapshot': bytes(rec(FD_A, zadd('a')), rec(0, zsnap)),
  'keep-snapshot-del': bytes(rec(0, zkeep('a')), rec(0, zsnap), rec(0, zdel('a'))),
  'add-replace-netns': bytes(rec(FD_A, zadd('a')), rec(FD_B, zadd('a')), rec(0, zsnap), rec(0, zdel('a'))),
  'add-same-netns-twice': bytes(rec(FD_A, zadd('a')), rec(FD_A, zadd('a')), rec(0, zsnap)),
  'snapshot-removes-unnamed': bytes(rec(FD_A, zadd('a')), rec(FD_B, zadd('b')), rec(0, zdel('a')), rec(0, zsnap)),
  'session': bytes(
    rec(FD_A, zadd('a')), rec(FD_B, zadd('b')), rec(0, zkeep('c')), rec(0, zdel('b')), rec(0, zsnap),
    rec(FD_B, zadd('c')), rec(0, zdel('a')), rec(FD_A, zadd('c')),
  ),
  'failing-add-pending': bytes(rec(FD_A, zadd('x!')), rec(0, zsnap), rec(0, zdel('x!'))),
  'add-without-fd': rec(0, zadd('a')),
  'add-with-two-fds': rec(TWO_FDS, zadd('a')),
  'add-without-info': rec(FD_A, len(1, msg(len(1, 'a')))),
  'keep-after-snapshot': bytes(rec(0, zsnap), rec(0, zkeep('a'))),
  'second-snapshot': bytes(rec(0, zsnap), rec(0, zsnap)),
  'unknown-payload': rec(0, Buffer.from([0x22, 0x00])),
  'empty-datagram': bytes(rec(FD_A, zadd('a')), rec(0, Buffer.alloc(0))),
  'oversize': bytes(rec(0, zkeep('a')), rec(PAD, zkeep('b'))),
});

// PROXY v2: flags (1: source IPv4, 2: destination IPv4, 4: identity), source (16 bytes) and port, destination and
// port, u16 padding, then trust domain, namespace and service account separated by NUL (fuzz_targets/proxy_v2.rs).
const addr16 = (ip) => bytes(ip, Buffer.alloc(16 - ip.length));
const be16 = (n) => Buffer.from([n >> 8, n & 0xff]);
const pp = (flags, src, sport, dst, dport, pad, id) =>
  bytes([flags], addr16(src), be16(sport), addr16(dst), be16(dport), be16(pad), Buffer.from(id));
const ID = 'cluster.local\0default\0sleep';
// spiffe://cluster.local/ns/default/sa/sleep is 42 bytes: 12 (two IPv4 addresses and ports) + 3 + 42 + pad <= 65535.
const fits = 65535 - 12 - 3 - 42;
seeds('proxy_v2', {
  'ipv4-identity': pp(7, ip4('10.0.0.1'), 41000, ip4('10.96.0.10'), 80, 0, ID),
  'ipv6-identity': pp(4, ip6([0xfd00, 0, 0, 0, 0, 0, 0, 1]), 41000, ip6([0xfd00, 0, 0, 0, 0, 0, 0, 2]), 443, 0, ID),
  'mixed-families': pp(5, ip4('10.0.0.1'), 1, ip6([0xfd00, 0, 0, 0, 0, 0, 0, 2]), 2, 0, ID),
  'mapped-ipv6': pp(6, ip6([0, 0, 0, 0, 0, 0xffff, 0x0a00, 1]), 1, ip4('10.0.0.2'), 2, 0, ID),
  'no-identity': pp(3, ip4('10.0.0.1'), 1, ip4('10.0.0.2'), 2, 0, ''),
  'identity-fits-exactly': pp(7, ip4('10.0.0.1'), 1, ip4('10.0.0.2'), 2, fits, ID),
  'identity-one-byte-too-long': pp(7, ip4('10.0.0.1'), 1, ip4('10.0.0.2'), 2, fits + 1, ID),
  'identity-odd-text': pp(7, ip4('0.0.0.0'), 0, ip4('255.255.255.255'), 65535, 0, 'td/with/slash\0ns\u00e9\0sa\n'),
});

// DNS: header (id, flags, counts), questions, and an OPT record when asked.
const qname = (n) => bytes(...n.split('.').filter(Boolean).map((l) => bytes([l.length], l)), [0]);
const T = { A: 1, PTR: 12, TXT: 16, AAAA: 28, SRV: 33 };
function dns({ id = 0x1234, flags = 0x0100, questions = [], opt = null }) {
  const q = questions.map(([n, type, cls = 1]) => bytes(qname(n), be16(type), be16(cls)));
  const ar = opt ? [bytes([0], be16(41), be16(opt.payload), [0, opt.version ?? 0], be16(opt.do ? 0x8000 : 0), be16(0))] : [];
  return bytes(be16(id), be16(flags), be16(questions.length), be16(0), be16(0), be16(ar.length), ...q, ...ar);
}
const ask = (n, type, rest = {}) => dns({ questions: [[n, type]], ...rest });
seeds('dns', {
  'a-service-fqdn': ask('api.default.svc.cluster.local', T.A),
  'aaaa-service-fqdn': ask('api.default.svc.cluster.local', T.AAAA),
  'a-short-name': ask('api', T.A),
  'a-name-namespace': ask('api.default', T.A),
  'a-headless': ask('web.default.svc.cluster.local', T.A),
  'a-headless-pod': ask('web-1.web.default.svc.cluster.local', T.A),
  'srv-service': ask('api.default.svc.cluster.local', T.SRV),
  'srv-headless': ask('web.default.svc.cluster.local', T.SRV),
  'a-wildcard': ask('shop.example.com', T.A),
  'a-other-namespace-hidden': ask('db.other.svc.cluster.local', T.A),
  'a-localhost': ask('localhost', T.A),
  'ptr-loopback': ask('1.0.0.127.in-addr.arpa', T.PTR),
  'a-invalid': ask('x.invalid', T.A),
  'a-forwarded': ask('example.org', T.A),
  'chaos-txt': dns({ questions: [['version.bind', T.TXT, 3]] }),
  'edns-4096-do': ask('api.default.svc.cluster.local', T.A, { opt: { payload: 4096, do: true } }),
  'edns-version-1': ask('api', T.A, { opt: { payload: 1232, version: 1 } }),
  'opcode-status': ask('api', T.A, { flags: (2 << 11) | 0x0100 }),
  'two-questions': dns({ questions: [['api', T.A], ['web', T.A]] }),
  // Their FORMERR's echo does not fit 512 bytes even truncated (found by fuzzing).
  'many-questions': dns({ questions: Array.from({ length: 20 }, (_, i) => [`q${i}.api.default.svc.cluster.local`, T.A]) }),
  'no-question': dns({}),
  'response-bit': ask('api', T.A, { flags: 0x8180 }),
  'truncated-question': bytes(be16(0x4242), be16(0x0100), be16(1), be16(0), be16(0), be16(0), [3], 'ab'),
  // A name compressed by a pointer to itself: a decoder must refuse, not loop.
  'compression-loop': bytes(be16(7), be16(0x0100), be16(1), be16(0), be16(0), be16(0), [0xc0, 12], be16(1), be16(1)),
});
