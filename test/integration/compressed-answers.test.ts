// /metrics and the admin answer compressed when the client asks (Accept-Encoding: gzip, br, deflate), as ztunnel's
// servers do: a gzip scrape is read back by Prometheus's own text parser (prometheus-client, PyPI), and a client
// that does not ask, or refuses with q=0, gets the plain text.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { request, type IncomingHttpHeaders } from 'node:http';
import { brotliDecompressSync, gunzipSync, inflateSync } from 'node:zlib';
import { makeTempDir, startDaemon, workload } from '../helpers/daemon.js';
import { BLOCKS, block } from '../helpers/net.js';
import { PYTHON, skipWithoutPython } from '../helpers/prereqs.js';

const net = block(BLOCKS['compressed-answers']);
const CONFIG = { workloads: [workload({ name: 'sleep', ip: net.workload(1), node: 'node-a' })] };

/** What `get` resolves. */
interface Answer {
  status: number | undefined;
  headers: IncomingHttpHeaders;
  bytes: Buffer;
}

/** GET with an Accept-Encoding (or none): the status, the headers, and the body's bytes as they came. */
function get(url: string, acceptEncoding?: string): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const headers = acceptEncoding === undefined ? {} : { 'accept-encoding': acceptEncoding };
    const req = request(url, { agent: false, headers, timeout: 5_000 }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, bytes: Buffer.concat(chunks) }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end();
  });
}

/** The metric families Prometheus's parser reads from `text` (their names, sorted). */
function parseWithPrometheus(text: string): string[] {
  const py = 'import sys\nfrom prometheus_client.parser import text_string_to_metric_families as p\nprint("\\n".join(sorted({f.name for f in p(sys.stdin.read())})))';
  const r = spawnSync(PYTHON, ['-c', py], { input: text, encoding: 'utf8' });
  assert.equal(r.status, 0, `the Prometheus parser read the scrape: ${r.stderr}`);
  return r.stdout.trim().split('\n');
}

test('a compressed scrape reads back with Prometheus\'s parser; the admin answers in each encoding; plain when not asked', { skip: skipWithoutPython('prometheus-client') }, async (t) => {
  const d = await startDaemon({ node: 'node-a', config: CONFIG, caDir: makeTempDir('ztn-compress-ca-'), adminIp: net.admin(1), cleanup: t });
  const plain = await get(`${d.statsUrl}/metrics`);
  assert.equal(plain.headers['content-encoding'], undefined, 'no Accept-Encoding: plain');
  const gz = await get(`${d.statsUrl}/metrics`, 'gzip');
  assert.equal(gz.status, 200);
  assert.equal(gz.headers['content-encoding'], 'gzip');
  assert.match(gz.headers.vary ?? '', /accept-encoding/i);
  assert.ok(gz.bytes.length < plain.bytes.length / 3, `compressed: ${gz.bytes.length} of ${plain.bytes.length} bytes`);
  const families = parseWithPrometheus(gunzipSync(gz.bytes).toString('utf8'));
  assert.deepEqual(families, parseWithPrometheus(plain.bytes.toString('utf8')), 'the same families as the plain scrape');
  assert.ok(families.includes('istio_build') && families.some((f) => f.startsWith('istio_tcp_connections_opened')), families.join(' '));
  // The admin: each encoding by the client's weights, and q=0 refuses one.
  const decode = { gzip: gunzipSync, br: brotliDecompressSync, deflate: inflateSync };
  for (const [accept, want] of [['br', 'br'], ['deflate, gzip;q=0.5', 'deflate'], ['gzip;q=0, br;q=0.1', 'br'], ['gzip;q=0', undefined], ['identity', undefined]] as const) {
    const r = await get(`${d.adminUrl}/config_dump`, accept);
    assert.equal(r.status, 200);
    assert.equal(r.headers['content-encoding'], want, `Accept-Encoding: ${accept}`);
    const body = want === undefined ? r.bytes : decode[want](r.bytes);
    assert.ok(Array.isArray((JSON.parse(body.toString('utf8')) as { workloads: unknown }).workloads), `${accept}: the config dump, whole`);
  }
  await d.stop();
});
