// The SOCKS5 client against a scripted SOCKS5 server (a real TCP server on 127.0.0.1:0).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:net';
import type { AddressInfo } from 'node:net';
import type { TestContext } from 'node:test';
import { encodeConnectRequest, socks5Connect } from '../../dist/cli/socks5-client.js';
import { waitFor } from '../helpers/net.js';

/** A SOCKS5 server that records the CONNECT request, answers `rep`, then echoes (prefixed by `early`). */
async function fakeSocks(
  t: TestContext,
  { rep = 0, early = Buffer.alloc(0), method = 0 }: { rep?: number; early?: Buffer; method?: number } = {},
): Promise<{ port: number; requests: Buffer[] }> {
  const requests: Buffer[] = [];
  const server = createServer((sock) => {
    let buf = Buffer.alloc(0);
    let stage = 0;
    sock.on('data', (chunk) => {
      buf = Buffer.concat([buf, chunk]);
      if (stage === 0 && buf.length >= 3) {
        buf = buf.subarray(2 + buf[1]);
        sock.write(Buffer.from([5, method]));
        stage = 1;
      }
      if (stage === 1 && buf.length >= 10) {
        requests.push(Buffer.from(buf));
        buf = Buffer.alloc(0);
        sock.write(Buffer.concat([Buffer.from([5, rep, 0, 1, 127, 0, 0, 1, 0x1f, 0x90]), early]));
        stage = 2;
        if (rep !== 0) sock.end();
        return;
      }
      if (stage === 2) {
        sock.write(buf);
        buf = Buffer.alloc(0);
      }
    });
    sock.on('error', () => {});
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.after(() => server.close());
  return { port: (server.address() as AddressInfo).port, requests };
}

test('CONNECT requests encode IPv4, IPv6 and domain names', () => {
  assert.deepEqual([...encodeConnectRequest('127.0.2.10', 8080)], [5, 1, 0, 1, 127, 0, 2, 10, 0x1f, 0x90]);
  const v6 = encodeConnectRequest('::1', 80);
  assert.equal(v6[3], 4);
  assert.deepEqual([...v6.subarray(4, 20)], [...Array(15).fill(0), 1]);
  assert.deepEqual([...encodeConnectRequest('fe80::1:2', 1).subarray(4, 20)], [0xfe, 0x80, ...Array(10).fill(0), 0, 1, 0, 2]);
  assert.deepEqual([...encodeConnectRequest('a.b', 80)], [5, 1, 0, 3, 3, 97, 46, 98, 0, 80]);
});

test('connects, sends the request, and keeps bytes that arrived with the reply', async (t) => {
  const { port, requests } = await fakeSocks(t, { early: Buffer.from('early|') });
  const sock = await socks5Connect({ proxyHost: '127.0.0.1', proxyPort: port, destHost: '127.0.2.10', destPort: 8080 });
  t.after(() => sock.destroy());
  assert.deepEqual([...requests[0]], [5, 1, 0, 1, 127, 0, 2, 10, 0x1f, 0x90]);
  let got = '';
  sock.on('data', (d) => (got += d.toString()));
  sock.resume();
  sock.write('ping');
  await waitFor(() => got.length >= 'early|ping'.length, { timeoutMs: 5_000, intervalMs: 5, message: 'the early bytes and the echo' });
  assert.equal(got, 'early|ping');
});

test('a refused CONNECT rejects with the reply meaning', async (t) => {
  const { port } = await fakeSocks(t, { rep: 5 });
  await assert.rejects(
    socks5Connect({ proxyHost: '127.0.0.1', proxyPort: port, destHost: '10.0.0.1', destPort: 1 }),
    /CONNECT refused: connection refused/,
  );
});

test('a proxy that wants authentication is rejected', async (t) => {
  const { port } = await fakeSocks(t, { method: 0xff });
  await assert.rejects(socks5Connect({ proxyHost: '127.0.0.1', proxyPort: port, destHost: '10.0.0.1', destPort: 1 }), /requires authentication/);
});

test('nothing listening → a clear error', async () => {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;
  await new Promise((resolve) => server.close(resolve));
  await assert.rejects(socks5Connect({ proxyHost: '127.0.0.1', proxyPort: port, destHost: '10.0.0.1', destPort: 1 }), /ECONNREFUSED/);
});
