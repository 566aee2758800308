// The hand-written OTLP encoding of access records (ts/log/otlp-wire.ts), read back with @bufbuild/protobuf's generic
// wire reader: every field where opentelemetry-proto puts it, every length right (the real collector reads it too, in
// test/integration/otlp-export.test.ts).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { BinaryReader, WireType } from '@bufbuild/protobuf/wire';
import { LogsRequestWriter } from '../../dist/log/otlp-wire.js';
import type { LogRecordIn } from '../../dist/log/otlp-wire.js';

/** One field's value as the reader gives it: bytes (strings, sub-messages), or a 64-bit integer. */
type WireValue = Uint8Array | bigint | string;

/** A message's fields: field number → the values read (sub-messages as bytes). */
function fields(bytes: WireValue): Map<number, WireValue[]> {
  const r = new BinaryReader(bytes as Uint8Array);
  const out = new Map<number, WireValue[]>();
  while (r.pos < r.len) {
    const [no, wt] = r.tag();
    let v: WireValue;
    if (wt === WireType.LengthDelimited) v = r.bytes();
    else if (wt === WireType.Varint) v = r.uint64();
    else if (wt === WireType.Bit64) v = r.fixed64();
    else throw new Error(`wire type ${wt}`);
    out.set(no, [...(out.get(no) ?? []), v]);
  }
  return out;
}
const text = (b: WireValue): string => new TextDecoder().decode(b as Uint8Array);
function anyValue(b: Uint8Array): string | boolean | bigint | number {
  const f = fields(b);
  if (f.has(1)) return text(f.get(1)![0]);
  if (f.has(2)) return f.get(2)![0] === 1n;
  if (f.has(3)) return BigInt.asIntN(64, BigInt(f.get(3)![0] as bigint));
  return new DataView(b.buffer, b.byteOffset + 1, 8).getFloat64(0, true);
}
const attrs = (list: WireValue[] | undefined): Record<string, unknown> =>
  Object.fromEntries((list ?? []).map((kv) => { const f = fields(kv); return [text(f.get(1)![0]), anyValue(f.get(2)![0] as Uint8Array)]; }));

test('an ExportLogsServiceRequest as opentelemetry-proto lays it out', () => {
  const resource = { 'service.name': 'ztunnel-node', 'k8s.node.name': 'nödé-ä' };
  const w = new LogsRequestWriter(resource, 'ztunnel-node.access');
  const long = 'x'.repeat(300); // a length over one varint byte
  const records: LogRecordIn[] = [
    { timeMs: 1_700_000_000_123, severityNumber: 9, severityText: 'INFO', body: 'connection complete', attributes: { 'src.addr': '10.0.0.1:40000', 'destination.port': 8080, ok: true, ratio: 0.5, neg: -3, long } },
    { timeMs: 1, severityNumber: 13, severityText: 'WARN', body: 'connection failed', attributes: {} },
    { timeMs: 2, severityNumber: 9, severityText: 'INFO', body: 'b', attributes: { a: 'x' }, more: { b: 2 } },
  ];
  const req = fields(w.encode(records));
  assert.deepEqual([...req.keys()], [1]);
  const rl = fields(req.get(1)![0]);
  assert.deepEqual(attrs(fields(rl.get(1)![0]).get(1)), resource);
  const sl = fields(rl.get(2)![0]);
  assert.equal(text(fields(sl.get(1)![0]).get(1)![0]), 'ztunnel-node.access');
  const [a, b, c] = sl.get(2)!.map(fields);
  assert.equal(BigInt(a.get(1)![0] as bigint), 1_700_000_000_123_000_000n, 'time_unix_nano');
  assert.equal(BigInt(a.get(11)![0] as bigint), 1_700_000_000_123_000_000n, 'observed_time_unix_nano');
  assert.equal(a.get(2)![0], 9n);
  assert.equal(text(a.get(3)![0]), 'INFO');
  assert.equal(anyValue(a.get(5)![0] as Uint8Array), 'connection complete');
  assert.deepEqual(attrs(a.get(6)), { 'src.addr': '10.0.0.1:40000', 'destination.port': 8080n, ok: true, ratio: 0.5, neg: -3n, long });
  assert.equal(b.get(2)![0], 13n);
  assert.equal(b.get(6), undefined, 'no attributes, no field');
  assert.deepEqual(attrs(c.get(6)), { a: 'x', b: 2n }, '`more` follows `attributes`');
});

test('a batch of 512 records of 21 attributes each holds all 512', () => {
  const w = new LogsRequestWriter({ 'service.name': 'ztunnel-node' }, 'ztunnel-node.access');
  const attributes = Object.fromEntries(Array.from({ length: 20 }, (_, i) => [`field.${i}`, i % 2 ? `value-${i}-${'v'.repeat(20)}` : i * 1000]));
  const records = Array.from({ length: 512 }, (_, i) => ({ timeMs: Date.now(), severityNumber: 9, severityText: 'INFO', body: 'connection complete', attributes: { ...attributes, i } }));
  const bytes = w.encode(records);
  assert.equal(fields(fields(fields(bytes).get(1)![0]).get(2)![0]).get(2)!.length, 512, 'all 512 records in the batch');
});

test('the semantic conventions\' names from an access record\'s addresses (IPv4, IPv6, missing)', async () => {
  const { semconvAttributes, splitAddress } = await import('../../dist/log/otlp.js');
  assert.deepEqual(semconvAttributes({ 'src.addr': '10.0.0.1:4000', 'dst.addr': '[fd00::1]:8080' }), {
    'network.transport': 'tcp', 'source.address': '10.0.0.1', 'source.port': 4000, 'destination.address': 'fd00::1', 'destination.port': 8080,
  });
  assert.deepEqual(semconvAttributes({ 'dst.addr': '10.0.0.2:80' }), { 'network.transport': 'tcp', 'destination.address': '10.0.0.2', 'destination.port': 80 });
  for (const bad of [undefined, '', '10.0.0.1', ':80', '10.0.0.1:', '10.0.0.1:http']) assert.equal(splitAddress(bad), null, String(bad));
});
