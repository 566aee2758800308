// The OTLP export's semantic-convention attributes (ts/log/otlp.ts; the protobuf records themselves are encoded and
// tested in the dataplane, native/dataplane/src/otlp.rs, and read by a real collector in
// test/integration/otlp-export.test.ts).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { semconvAttributes, splitAddress } from '../../dist/log/otlp.js';

test('the semantic conventions\' names from an access record\'s addresses (IPv4, IPv6, missing)', () => {
  assert.deepEqual(semconvAttributes({ 'src.addr': '10.0.0.1:4000', 'dst.addr': '[fd00::1]:8080' }), {
    'network.transport': 'tcp', 'source.address': '10.0.0.1', 'source.port': 4000, 'destination.address': 'fd00::1', 'destination.port': 8080,
  });
  assert.deepEqual(semconvAttributes({ 'dst.addr': '10.0.0.2:80' }), { 'network.transport': 'tcp', 'destination.address': '10.0.0.2', 'destination.port': 80 });
  for (const bad of [undefined, '', '10.0.0.1', ':80', '10.0.0.1:', '10.0.0.1:http']) assert.equal(splitAddress(bad), null, String(bad));
});
