// Shared (in-pod) mode's polling of the workload proxy manager: readiness follows the manager, and the frequent
// callers (the 250 ms poll, metric scrapes) ask for the state without the pods' live connections, whose listing
// costs O(connections); only config_dump asks for them.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pino from 'pino';
import { loadConfig } from '../../dist/config/index.js';
import { startCapture, CAPTURE_POLL_MS } from '../../dist/lifecycle/capture.js';
import { Readiness } from '../../dist/lifecycle/readiness.js';
import type { CapturePort } from '../../dist/lifecycle/capture.js';
import type { InPodState, SelfInboundSpec } from '../../dist/native/types.js';

test('in-pod polls and scrapes leave the live connections out; config_dump lists them', (t) => {
  // The poll runs on node:test's mock timers: each tick is one poll, however busy the machine.
  t.mock.timers.enable({ apis: ['setInterval'] });
  const calls: ({ connections: boolean } | undefined)[] = [];
  let state: InPodState = { connected: true, snapshotReceived: true, ready: false, lastError: null, activeProxies: 0, pendingProxies: 1, proxiesStarted: 0, proxiesStopped: 0, workloads: {} };
  const dp: CapturePort = {
    startInpod: () => undefined,
    startDedicated: async () => undefined,
    startSelfInbound: async () => '[::]:15008',
    inpodState: (opts) => (calls.push(opts), state),
  };
  const config = loadConfig({ env: { PROXY_MODE: 'shared', NODE_NAME: 'node-a', INPOD_UDS: '/tmp/unused.sock', XDS_ADDRESS: '', CA_ADDRESS: '' } });
  const readiness = new Readiness();
  const capture = startCapture(config, dp, readiness, pino({ level: 'silent' }), async () => undefined);
  try {
    t.mock.timers.tick(CAPTURE_POLL_MS);
    t.mock.timers.tick(CAPTURE_POLL_MS);
    assert.equal(calls.length, 2, 'the manager is polled once per interval');
    assert.ok(calls.every((o) => o?.connections === false), `polls: ${JSON.stringify(calls)}`);
    assert.ok(readiness.pending().includes('workload proxy manager'), 'pending while a pod is pending');
    state = { ...state, ready: true, pendingProxies: 0, activeProxies: 1 };
    t.mock.timers.tick(CAPTURE_POLL_MS);
    assert.ok(!readiness.pending().includes('workload proxy manager'), 'done once the manager is ready');

    calls.length = 0;
    capture.counters();
    assert.deepEqual(calls, [{ connections: false }], 'a metrics scrape');
    calls.length = 0;
    capture.workloadState();
    assert.equal(calls.length, 1);
    assert.notEqual(calls[0]?.connections, false, 'config_dump lists the connections');
  } finally {
    capture.stop();
  }
});

test('shared mode serves the daemon\'s own pod\'s inbound HBONE when it knows its pod and the proxies are on', async () => {
  const specs: SelfInboundSpec[] = [];
  const dp: CapturePort = {
    startInpod: () => undefined,
    startDedicated: async () => undefined,
    startSelfInbound: async (spec) => (specs.push(spec), '[::]:15008'),
    inpodState: () => null,
  };
  const pod = { POD_NAME: 'ztunnel-x', POD_NAMESPACE: 'istio-system', SERVICE_ACCOUNT: 'ztunnel' };
  const base = { PROXY_MODE: 'shared', NODE_NAME: 'node-a', INPOD_UDS: '/tmp/unused.sock', XDS_ADDRESS: '', CA_ADDRESS: '' };
  for (const [env, want] of [[{ ...base, ...pod }, 1], [base, 0], [{ ...base, ...pod, ENABLE_PROXY: 'false' }, 0]] as const) {
    specs.length = 0;
    const capture = startCapture(loadConfig({ env }), dp, new Readiness(), pino({ level: 'silent' }), async () => undefined);
    capture.stop();
    assert.equal(specs.length, want, JSON.stringify(env));
  }
  specs.length = 0;
  startCapture(loadConfig({ env: { ...base, ...pod, STATS_ADDR: '0.0.0.0:16020' } }), dp, new Readiness(), pino({ level: 'silent' }), async () => undefined).stop();
  // The stats and readiness ports may be reached through it; the admin's is not among them.
  assert.deepEqual(specs[0], { namespace: 'istio-system', name: 'ztunnel-x', serviceAccount: 'ztunnel', reachablePorts: [16020, 15021], reusePort: true });
});
