// The readiness address bound before the daemon's modules load (admin/early-readiness.ts): what it answers, and
// when the daemon takes the server over or leaves it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:net';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { bindEarlyReadiness, takeEarlyReadiness } from '../../dist/admin/early-readiness.js';
import { BLOCKS, block, httpGet, waitFor } from '../helpers/net.js';
import type { SocketAddress } from '../../dist/config/index.js';

const net = block(BLOCKS['early-readiness']);
const at = (k: number): SocketAddress => ({ host: net.admin(k), port: 15021 });
const url = (k: number) => `http://${net.admin(k)}:15021/healthz/ready`;
const handler = (body: string) => (_req: IncomingMessage, res: ServerResponse) => res.end(body);

test('answers "not ready" with the starting tasks until taken over; the same server then answers for the daemon', async (t) => {
  bindEarlyReadiness({ READINESS_ADDR: `${net.admin(1)}:15021` }, ['ztunnel']);
  // Its first answer (a refused connection until the bind completes).
  const early = await waitFor(() => httpGet(url(1), { timeoutMs: 1_000 }), { timeoutMs: 5_000, intervalMs: 5, message: 'the early readiness server to answer' });
  assert.deepEqual([early.status, early.body], [500, 'not ready, pending: certificates, proxy, state manager\n']);
  const server = await takeEarlyReadiness(at(1), handler('taken\n'));
  t.after(() => server?.close());
  assert.ok(server?.listening, 'the daemon gets the listening server');
  assert.equal((await httpGet(url(1))).body, 'taken\n');
  assert.equal(await takeEarlyReadiness(at(1), handler('x')), null, 'taken once');
});

test('left to the daemon: an address already taken, another address configured, or flags given', async () => {
  const squatter = createServer();
  await new Promise<void>((r) => squatter.listen(15021, net.admin(2), r));
  try {
    bindEarlyReadiness({ PROXY_MODE: 'local', READINESS_ADDR: `${net.admin(2)}:15021` }, []);
    assert.equal(await takeEarlyReadiness(at(2), handler('x')), null, 'the bind failed: the daemon reports it');
  } finally {
    squatter.close();
  }
  bindEarlyReadiness({ READINESS_ADDR: `${net.admin(3)}:15021` }, []);
  assert.equal(await takeEarlyReadiness(at(2), handler('x')), null, 'the daemon listens elsewhere');
  await assert.rejects(httpGet(url(3), { timeoutMs: 1_000 }), 'and the early server is closed');
  bindEarlyReadiness({ READINESS_ADDR: `${net.admin(3)}:15021` }, ['--readiness-addr', `${net.admin(2)}:15021`]);
  assert.equal(await takeEarlyReadiness(at(3), handler('x')), null, 'flags may change the address: nothing bound early');
});
