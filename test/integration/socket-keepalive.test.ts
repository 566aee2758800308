// KEEPALIVE_* as ztunnel's: every proxied socket of the daemon carries TCP keepalive with the configured time, read
// back from the kernel (`ss -o`: the keepalive timer of the daemon's accepted and upstream sockets), and none when
// KEEPALIVE_ENABLED=false.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { createServer } from 'node:net';
import { makeTempDir, startDaemon, workload } from '../helpers/daemon.js';
import { BLOCKS, block, socks5Request, waitFor } from '../helpers/net.js';

const net = block(BLOCKS['socket-keepalive']);
const SLEEP_IP = net.workload(1);
const SERVER = { host: net.workload(9), port: 9400 };
const CONFIG = { workloads: [workload({ name: 'sleep', ip: SLEEP_IP, node: 'node-a' })] };

/** The established sockets matching `filter`, as `ss -o` shows them (one line each). */
const sockets = (filter: string): string[] =>
  execFileSync('ss', ['-tnoH', 'state', 'established', filter], { encoding: 'utf8' }).split('\n').filter((l) => l.trim() !== '');

/** Seconds left on a socket line's keepalive timer (null: none). */
function keepaliveTimer(line: string): number | null {
  const m = /timer:\(keepalive,(?:(\d+)min)?(?:(\d+)(?:\.\d+)?sec|(\d+)ms)?/.exec(line);
  return m === null ? null : Number(m[1] ?? 0) * 60 + Number(m[2] ?? 0);
}

test('the daemon\'s accepted and upstream sockets carry the configured keepalive, and none when it is off', async (t) => {
  const server = createServer((s) => s.on('error', () => undefined));
  await new Promise<void>((r) => server.listen(SERVER.port, SERVER.host, r));
  t.after(() => server.close());
  for (const [i, env, want] of [[1, { KEEPALIVE_TIME: '77s', KEEPALIVE_INTERVAL: '5s', KEEPALIVE_RETRIES: '4' }, 77], [2, { KEEPALIVE_ENABLED: 'false' }, null]] as const) {
    const d = await startDaemon({ node: 'node-a', config: CONFIG, caDir: makeTempDir('ztn-keepalive-ca-'), adminIp: net.admin(i), env, cleanup: t });
    const { code, socket } = await socks5Request({ socks: { host: SLEEP_IP, port: 15080 }, dest: SERVER });
    assert.equal(code, 0);
    // The daemon's side of the client's connection (it accepted on 15080), and its upstream to the server.
    const accepted = `( src ${SLEEP_IP}:15080 and dst ${socket.localAddress}:${socket.localPort} )`;
    const upstream = `( dst ${SERVER.host}:${SERVER.port} )`;
    for (const [what, filter] of [['accepted', accepted], ['upstream', upstream]]) {
      // ss shows one timer: until the last bytes sent are acknowledged it is the retransmission timer (`on`).
      const line = await waitFor(() => {
        const l = sockets(filter);
        return l.length === 1 && !/timer:\(on,/.test(l[0]) ? l[0] : null;
      }, { message: `${what}: one socket, everything it sent acknowledged` });
      const timer = keepaliveTimer(line);
      if (want === null) assert.equal(timer, null, `${what}: no keepalive timer when KEEPALIVE_ENABLED=false: ${line}`);
      else assert.ok(timer !== null && timer > want - 15 && timer <= want, `${what}: keepalive timer ${timer} s of ${want}: ${line}`);
    }
    socket.destroy();
    await d.stop();
  }
});
