// Property tests (fast-check) over the local config file, the daemon's other input besides istiod: any text, any
// JSON document and structurally plausible documents with hostile field values. Properties: the loader never throws
// anything but a LocalConfigError naming the source; and the records of whatever it accepts, sent again as a
// JSON delta, are accepted too (a record reads what it writes).
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { parseLocalConfig } from '../../dist/config/local.js';
import type { LocalConfig } from '../../dist/config/local.js';
import { LocalConfigError } from '../../dist/errors.js';
import { openNativeDataplane } from '../helpers/native-dataplane.js';

const RUNS = Number(process.env.FUZZ_RUNS ?? 300);
const dp = openNativeDataplane();
after(() => dp.shutdown());

function parseOrRefuse(text: string): LocalConfig | null {
  try {
    return parseLocalConfig(text, 'fuzz.yaml');
  } catch (err) {
    assert.ok(err instanceof LocalConfigError, `a ${err?.constructor?.name}: ${(err as Error | null)?.message}`);
    assert.ok(err.message.startsWith('fuzz.yaml'), err.message);
    return null;
  }
}

test('any text: parsed, or refused with a LocalConfigError naming the file', () => {
  fc.assert(fc.property(fc.string({ unit: 'binary', maxLength: 200 }), (text) => void parseOrRefuse(text)), { numRuns: RUNS });
});

test('any JSON document (JSON is YAML): parsed, or refused with a LocalConfigError naming the file', () => {
  fc.assert(fc.property(fc.jsonValue({ maxDepth: 4 }), (doc) => void parseOrRefuse(JSON.stringify(doc))), { numRuns: RUNS });
});

// Field values a hostile or careless author could write: names, separators of headers and baggage, control
// characters, non-ASCII, numbers where strings go.
const value = fc.oneof(
  fc.stringMatching(/^[a-z0-9-]{1,10}$/),
  fc.string({ maxLength: 12 }),
  fc.constantFrom('', ' ', 'a,b', 'k=v;x', 'a\u0000b', 'a\nb', 'ü', '*.example.com', '10.0.0.1', '::1', 'x/y'),
  fc.integer({ min: -1, max: 70000 }),
);
const ip = fc.oneof(fc.ipV4(), fc.ipV6(), value);
const workload = fc.record(
  {
    uid: value,
    name: value,
    namespace: value,
    serviceAccount: value,
    trustDomain: value,
    workloadIps: fc.array(ip, { maxLength: 2 }),
    protocol: fc.constantFrom('HBONE', 'TCP', 'NONE'),
    node: value,
    canonicalName: value,
    hostname: value,
    services: fc.dictionary(fc.oneof(fc.constant('default/echo.default.svc.cluster.local'), value), fc.dictionary(fc.constantFrom('80', '0', '70000', 'x'), fc.integer({ min: -1, max: 70000 })), { maxKeys: 2 }),
    locality: fc.record({ region: value, zone: value }, { requiredKeys: [] }),
  },
  { requiredKeys: ['uid', 'name', 'namespace'] },
);
const service = fc.record(
  {
    name: value,
    namespace: value,
    hostname: value,
    vips: fc.array(fc.oneof(ip.map((a) => `/${a}`), value), { maxLength: 2 }),
    ports: fc.dictionary(fc.constantFrom('80', '443', '0', 'x'), fc.integer({ min: -1, max: 70000 }), { maxKeys: 2 }),
    ipFamilies: fc.constantFrom('Dual', 'IPv4', 'IPv6', 'Both'),
    visibility: fc.constantFrom('Public', 'Namespace', null),
  },
  { requiredKeys: ['name', 'namespace', 'hostname'] },
);

test('plausible documents with hostile values: the records of what the reader accepts are accepted again as a delta', () => {
  let accepted = 0;
  fc.assert(
    fc.property(fc.record({ workloads: fc.array(workload, { maxLength: 3 }), services: fc.array(service, { maxLength: 3 }) }), (doc) => {
      const cfg = parseOrRefuse(JSON.stringify(doc));
      if (cfg === null) return;
      accepted++;
      // Unique keys, as the loader's own duplicate checks leave them.
      const workloads = [...new Map(cfg.workloads.map((w) => [w.uid, w])).values()];
      const services = [...new Map(cfg.services.map((s) => [`${s.namespace}/${s.hostname}`, s])).values()];
      dp.applyState({ full: true, workloads, removedWorkloads: [], services, removedServices: [], policies: [], removedPolicies: [] });
    }),
    { numRuns: RUNS },
  );
  assert.ok(accepted > 0, 'some documents were accepted, so the second property was exercised');
});

test('regression (found by the property above): a "/" in a namespace, service account or trust domain is refused, from a file and from a delta', () => {
  for (const [doc, field] of [
    [{ services: [{ name: 'x', namespace: '/', hostname: 'x.example.com' }] }, 'services[0].namespace'],
    [{ workloads: [{ uid: 'u', name: 'w', namespace: 'default', serviceAccount: 'a/sa/b' }] }, 'workloads[0].serviceAccount'],
    [{ workloads: [{ uid: 'u', name: 'w', namespace: 'a/b' }] }, 'workloads[0].namespace'],
  ] as const) {
    assert.throws(() => parseLocalConfig(JSON.stringify(doc), 'f.yaml'), (e) => e instanceof LocalConfigError && e.message.includes(field) && e.message.includes('"/"'));
  }
  const service = { name: 'x', namespace: '/', hostname: 'x.example.com', vips: [], cidrVips: [], ports: {}, subjectAltNames: [], waypoint: null, weightedWaypoints: [], loadBalancer: null, ipFamilies: null, canonical: false, visibility: null };
  assert.throws(() => dp.applyState({ services: [service] }), /namespace: "\/" has the character "\/"/);
});
