// Hand-over with Envoy as the remote HBONE peer, both ways at once. A real Envoy waypoint
// (test/fixtures/envoy/waypoint.yaml) sits between `sleep` and `echo`, both on node-a: a stream from sleep to echo's
// VIP leaves node-a over HBONE to the waypoint's :15008 (Envoy is the server of node-a's pooled connection) and
// comes back over HBONE that Envoy originates to echo's :15008 (Envoy is the client of node-a's inbound connection).
// node-a restarts: both HTTP/2 connections, their TLS sessions and streams, go to the successor. Envoy must see no
// reset and no error: its error counters are read before and after, and must not move.
//
// Envoy comes from the project's virtual environment (npm test installs it). Without it this suite fails under CI and
// is skipped elsewhere.
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as delay } from 'node:timers/promises';
import { makeTempDir, removeTempDir, startDaemon, workload } from '../helpers/daemon.js';
import { envoyForSuite, startEnvoyWaypoint, waypointedService } from '../helpers/envoy-waypoint.js';
import { BLOCKS, block, waitFor } from '../helpers/net.js';
import { checkpoint, flowed, openStream as openStreamVia, startServer } from '../helpers/streams.js';
import type { ClientStream, StreamServer } from '../helpers/streams.js';

const B = block(BLOCKS['handover-envoy']);
const SLEEP = B.workload(1);
const ECHO = B.workload(2);
const WAYPOINT = B.workload(3);
const ECHO_VIP = '127.64.101.1';
const WAYPOINT_VIP = '127.64.101.2';
const SERVICE_PORT = 80;
const PORT = 8080;
const ECHO_HOST = 'echo.default.svc.cluster.local';
const WAYPOINT_HOST = 'waypoint.default.svc.cluster.local';
const ENVOY_ADMIN = { ip: B.admin(9), port: 15000 };
const SOCKS = { host: SLEEP, port: 15080 };

const mesh = waypointedService(
  { ip: WAYPOINT, node: 'node-w', host: WAYPOINT_HOST, vip: WAYPOINT_VIP },
  { name: 'echo', host: ECHO_HOST, vip: ECHO_VIP, port: SERVICE_PORT, targetPort: PORT },
);
const config = {
  workloads: [
    workload({ name: 'sleep', ip: SLEEP, node: 'node-a' }),
    workload({ name: 'echo', ip: ECHO, node: 'node-a', services: { [`default/${ECHO_HOST}`]: { [SERVICE_PORT]: PORT } } }),
    mesh.waypoint,
  ],
  services: mesh.services,
};

/** Envoy's counters of a peer that resets, errs or misbehaves, downstream (our pool's connection to its :15008) and
 *  upstream (its HBONE to our :15008). */
const ERRORS = /(reset|protocol_error|_timeout|_fail|_error|flood|invalid|overflow)/;
/** A connection closed with a stream still open, on either HBONE hop (the internal listeners' TCP proxies count
 *  every normal end that way, so only the HBONE hops are looked at). */
const CUT = /^(http\.connect_terminate|cluster\.connect_originate)\..*_with_active_rq$/;
/** While the streams are open, no connection of Envoy's may end at all. */
const DESTROYED = /_destroy/;
const notAdmin = (k: string): boolean => !k.startsWith('http.admin.') && !k.startsWith('listener.admin.');
/**
 * Envoy's upstream codec closes a connection that got GOAWAY from inside its dispatch when the last stream ends, and
 * then counts `upstream_cx_protocol_error` with this reason (a graceful close, by anyone's GOAWAY: a draining
 * ztunnel's too). Each such count must be one of these lines, and no other dispatch error may appear.
 */
const GRACEFUL = 'Error dispatching received data: Connection was closed while dispatching frames';

const envoy = envoyForSuite('hand-over with Envoy as the HBONE peer');

if (envoy !== null) {
  const tmp = makeTempDir('ztn-handover-envoy-');
  const caDir = join(tmp, 'ca');
  const cleanups: (() => Promise<unknown>)[] = [];
  after(async () => {
    for (const c of cleanups.reverse()) await c();
    removeTempDir(tmp);
  });

  /** sleep → echo's VIP through SOCKS5: node-a → Envoy → node-a → echo, both directions streaming. */
  const openStream = (srv: StreamServer): Promise<ClientStream> => openStreamVia(SOCKS, srv, { host: ECHO_VIP, port: SERVICE_PORT });

  test('Envoy as the HBONE peer both ways: a restart of node-a hands both connections over, Envoy sees no reset and no error', async (t) => {
    const srv = await startServer(PORT, ECHO);
    cleanups.push(() => srv.close());
    const env = { HANDOVER_SOCKET: join(tmp, 'a.sock') };
    const a1 = await startDaemon({ node: 'node-a', config, caDir, adminIp: B.admin(1), env, cleanup: t });
    const dir = join(tmp, 'envoy');
    mkdirSync(dir);
    const waypoint = await startEnvoyWaypoint({
      binary: envoy.binary,
      dir,
      caDir,
      ip: WAYPOINT,
      admin: ENVOY_ADMIN,
      service: { vip: ECHO_VIP, port: SERVICE_PORT, hostname: ECHO_HOST, endpoints: [`${ECHO}:${PORT}`] },
      // The waypoint's direct-workload chain: unused here.
      workloadIp: B.workload(4),
      // Its codec clients' errors, by reason (see GRACEFUL below).
      extraArgs: ['--component-log-level', 'client:debug', '--file-flush-interval-msec', '100'],
      cleanup: t,
    });
    const streams = [await openStream(srv), await openStream(srv)];
    await flowed(streams, 'before the restart');
    // The baseline, once Envoy counts both CONNECTs of each stream.
    const s0 = await waitFor(
      async () => {
        const s = await waypoint.stats(/.*/);
        const terminated = s['http.connect_terminate.downstream_rq_total'] ?? 0;
        const originated = s['cluster.connect_originate.upstream_rq_total'] ?? 0;
        return terminated >= 2 && originated >= 2 && s;
      },
      { message: 'Envoy terminated the streams\' HBONE and originated HBONE back to node-a' },
    );
    const watched = (stats: Record<string, number>, re: RegExp): Record<string, number> =>
      Object.fromEntries(Object.entries(stats).filter(([k]) => notAdmin(k) && re.test(k)));
    const moved = (before: Record<string, number>, after: Record<string, number>): [string, number][] =>
      Object.entries(after).filter(([k, v]) => v !== (before[k] ?? 0));
    assert.ok(Object.keys(watched(s0, ERRORS)).length > 10, `the error counters exist: ${Object.keys(watched(s0, ERRORS)).join(', ')}`);

    // The restart: the outbound pool's connection (to Envoy) and the inbound one (from Envoy) both cross.
    const a2 = await startDaemon({ node: 'node-a', config, caDir, adminIp: B.admin(2), env, cleanup: t });
    // Unref'd: once the exit has won the race, the deadline must not hold the process open.
    const exit = await Promise.race([a1.exited, delay(10_000, null, { ref: false })]);
    assert.equal(exit?.code, 0, `the predecessor exits 0: ${a1.tail()}`);
    const given = a1.logs.find((l) => l.message === 'hand-over given');
    assert.equal(given?.connections, 4, `every stream of both connections was handed over: ${a1.tail()}`);
    await flowed(streams, 'through the successor');
    for (const s of streams) await checkpoint(s, 'after the restart');
    // Envoy noticed nothing: no error, and not one of its connections ended.
    const s1 = await waypoint.stats(/.*/);
    assert.deepEqual(moved(watched(s0, ERRORS), watched(s1, ERRORS)), [], `no error counter moved:\n${waypoint.tail()}`);
    assert.deepEqual(moved(watched(s0, DESTROYED), watched(s1, DESTROYED)), [], 'no connection of Envoy\'s ended');
    const fresh = await openStream(srv);
    await flowed([fresh], 'a new stream through the successor');
    await checkpoint(fresh, 'a new stream through the successor');

    // The old streams end cleanly, as a client ends: sleep half-closes, echo sees it and closes. (Were echo to end
    // first, Envoy's CONNECT termination would answer the complete response with RST_STREAM(NO_ERROR), as RFC 9113
    // § 8.1 allows a server, hand-over or not.)
    for (const s of [...streams, fresh]) s.socket.end();
    await waitFor(() => [...streams, fresh].every((s) => s.server.ended), { timeoutMs: 10_000, message: 'echo saw each end' });
    for (const s of [...streams, fresh]) s.server.socket.end();
    await waitFor(() => streams.every((s) => s.closed) && fresh.closed, { timeoutMs: 10_000, message: 'the streams closed' });
    // Envoy ends a stream (and counts how) a little after relaying its last FIN: its counters once none is active.
    const active = (s: Record<string, number>): number =>
      (s['http.connect_terminate.downstream_rq_active'] ?? 0) + (s['cluster.connect_originate.upstream_rq_active'] ?? 0);
    const s2 = await waitFor(
      async () => {
        const s = await waypoint.stats(/.*/);
        return active(s) === 0 && s;
      },
      { message: 'Envoy ended every CONNECT' },
    );
    const graceful = 'cluster.connect_originate.upstream_cx_protocol_error';
    const dispatchErrors = () => readFileSync(waypoint.logPath, 'utf8').split('\n').filter((l) => l.includes('Error dispatching'));
    // The log is flushed every 100 ms: each count's line is there by then.
    const counted = (s2[graceful] ?? 0) - (s0[graceful] ?? 0);
    await waitFor(() => dispatchErrors().length >= counted, { timeoutMs: 3_000, message: 'Envoy logged each dispatch error' }).catch(() => {});
    const lines = dispatchErrors();
    assert.deepEqual(lines.filter((l) => !l.includes(GRACEFUL)), [], 'no dispatch error but the graceful close');
    assert.equal(counted, lines.length, 'each protocol error counted is a graceful close');
    assert.ok(counted <= 1, 'at most the one handed-over connection Envoy originated');
    delete s2[graceful];
    assert.deepEqual(moved(watched(s0, ERRORS), watched(s2, ERRORS)), [], `no error counter moved:\n${waypoint.tail()}`);
    assert.deepEqual(moved(watched(s0, CUT), watched(s2, CUT)), [], 'no HBONE connection closed under an open stream');
    // Envoy saw every stream end normally: none is left open on either side.
    assert.equal(s2['http.connect_terminate.downstream_rq_active'] ?? 0, 0, 'no CONNECT left open downstream');
    assert.equal(s2['cluster.connect_originate.upstream_rq_active'] ?? 0, 0, 'no CONNECT left open upstream');
    assert.equal(s2['http.connect_terminate.downstream_rq_total'] - s0['http.connect_terminate.downstream_rq_total'], 1, 'one new CONNECT: the fresh stream');
    await a2.stop();
  });
}
