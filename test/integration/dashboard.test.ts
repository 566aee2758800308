// The admin port's live dashboard (GET /dashboard), in a real headless browser with no network: a daemon in local mode
// with two workloads and a DENY policy; the test opens a tunnel and provokes a denial, and the page must show them as
// an operator would read them (identities, the deciding policy), with charts that have points, and the policy impact
// preview must answer from the page what a candidate would close and allow. A screenshot is kept
// in test-results/ (printed); DASHBOARD_SCREENSHOT=docs also copies it to docs/dashboard.png, the README's.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { copyFileSync, mkdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import type { Page } from 'playwright-core';
import { ROOT, makeTempDir, removeTempDir, startDaemon, workload, type Daemon } from '../helpers/daemon.js';
import { chromiumForSuite, openOffline, type OfflineBrowser } from '../helpers/browser.js';
import { block, BLOCKS, echoOnce, pattern, socks5Request, startEchoServer, type TestServer } from '../helpers/net.js';

// `document`: the functions handed to page.waitForFunction and page.evaluate run in the browser. Its DOM, as far as
// they read it (the tests compile without the DOM library).
interface PageElement {
  textContent: string | null;
  dataset: Record<string, string | undefined>;
  getAttribute(name: string): string | null;
  querySelectorAll(selectors: string): Iterable<PageElement>;
}
declare const document: {
  querySelectorAll(selectors: string): Iterable<PageElement>;
  getElementById(id: string): PageElement | null;
};

const B = block(BLOCKS.dashboard);
const SLEEP = B.workload(1);
const ECHO = B.workload(2);
const PORT = 8080;
const DENIED_PORT = 9090;
const ID = { sleep: 'spiffe://cluster.local/ns/default/sa/sleep', echo: 'spiffe://cluster.local/ns/default/sa/echo' };
const SCREENSHOT = join(ROOT, 'test-results', 'dashboard.png');

const chromium = chromiumForSuite('the dashboard in a headless browser');

if (chromium !== null) {
  const tmp = makeTempDir('ztn-dashboard-');
  let daemon: Daemon;
  let echo: TestServer;
  let browser: OfflineBrowser;
  let page: Page;
  const pageErrors: string[] = [];

  before(async () => {
    echo = await startEchoServer(ECHO, PORT);
    daemon = await startDaemon({
      node: 'node-a',
      caDir: join(tmp, 'ca'),
      adminIp: B.admin(1),
      config: {
        workloads: [workload({ name: 'sleep', ip: SLEEP, node: 'node-a' }), workload({ name: 'echo', ip: ECHO, node: 'node-a' })],
        policies: [{ name: 'deny-9090', namespace: 'default', scope: 'Namespace', action: 'Deny', rules: [[[{ destinationPorts: [DENIED_PORT] }]]] }],
      },
    });
    browser = await openOffline(chromium);
    page = await browser.context.newPage();
    page.on('pageerror', (err) => pageErrors.push(err.message));
    page.on('console', (m) => m.type() === 'error' && pageErrors.push(m.text()));
  });

  after(async () => {
    await browser?.close();
    await daemon?.stop();
    await echo?.close?.();
    removeTempDir(tmp);
  });

  /** Waits until the text of `selector` holds every one of `texts` (the page renders from the event stream). */
  async function shows(selector: string, texts: string[], timeout = 10_000): Promise<void> {
    try {
      await page.waitForFunction<boolean, [string, string[]]>(
        ([sel, want]) => [...document.querySelectorAll(sel)].some((e) => want.every((t) => e.textContent!.includes(t))),
        [selector, texts],
        { timeout, polling: 100 },
      );
    } catch (err) {
      const seen = await page.$$eval(selector, (els) => els.map((e) => e.textContent).join('\n')).catch(() => '(nothing)');
      assert.fail(`${selector} did not show ${JSON.stringify(texts)} within ${timeout} ms (${(err as Error).message.split('\n')[0]}); it shows:\n${seen}\n${daemon.tail(10)}`);
    }
  }

  /** Short connections of varying size for `ms`, and now and then a denied one. */
  async function traffic(ms: number): Promise<void> {
    const end = Date.now() + ms;
    for (let i = 0; Date.now() < end; i++) {
      const denied = i % 7 === 3;
      const c = await socks5Request({ socks: { host: SLEEP, port: 15080 }, dest: { host: ECHO, port: denied ? DENIED_PORT : PORT } });
      if (!denied) await echoOnce(c.socket!, pattern((64 + ((i * 37) % 200) * 8) * 1024, i));
      c.socket!.destroy();
      await new Promise((resolve) => setTimeout(resolve, 150 + ((i * 53) % 250)));
    }
  }

  test('the dashboard loads offline and shows the workloads, tunnels, a denial with its policy, and charts', async () => {
    const started = Date.now();
    const res = await page.goto(`${daemon.adminUrl}/dashboard`);
    assert.equal(res!.status(), 200);
    assert.match(res!.headers()['content-security-policy'], /default-src 'none'/);
    await shows('#status', ['live']);
    await shows('#workloads tr', ['sleep', ID.sleep, `${SLEEP}`]);
    await shows('#workloads tr', ['echo', ID.echo, `${ECHO}`]);
    await shows('#certificates tr', [ID.sleep, 'Available', 'in 23h']);

    // A tunnel the test opens (sleep -> echo over HBONE, through this node's own inbound), kept open for a while.
    const tunnel = await socks5Request({ socks: { host: SLEEP, port: 15080 }, dest: { host: ECHO, port: PORT } });
    assert.equal(tunnel.code, 0);
    await echoOnce(tunnel.socket, pattern(256 * 1024));
    await shows('#flows tr', ['out', ID.sleep, ID.echo, 'mTLS']);
    await shows('#flows tr', ['in', ID.sleep, ID.echo, 'mTLS']);
    await shows('#connections tr', ['default/sleep', 'out', `${ECHO}:15008`, 'HBONE']);
    await shows('#connections tr', ['default/echo', 'in', `${ECHO}:${PORT}`, 'HBONE']);
    await shows('#t-tunnels', ['1 in / 1 out']);
    await shows('#t-resilience', ['0 retried / 0 ejected']);

    // A denial the test provokes: port 9090 is denied by default/deny-9090 (SOCKS5 "not allowed" after the 401).
    const denied = await socks5Request({ socks: { host: SLEEP, port: 15080 }, dest: { host: ECHO, port: DENIED_PORT } });
    assert.equal(denied.code, 2);
    denied.socket.destroy();
    await shows('#decisions tr.deny', ['denied', ID.sleep, ID.echo, `${ECHO}:${DENIED_PORT}`, 'default/deny-9090', 'explicitly denied by: default/deny-9090']);

    // An allowed connection shows when it ends (as the access log reports it).
    const short = await socks5Request({ socks: { host: SLEEP, port: 15080 }, dest: { host: ECHO, port: PORT } });
    assert.equal(short.code, 0);
    await echoOnce(short.socket, Buffer.from('allowed'));
    short.socket.destroy();
    await shows('#decisions tr.allow', ['allowed', ID.sleep, ID.echo, `${ECHO}:${PORT}`]);

    // Charts: points over time, with the tunnel's bytes and the denial in them.
    await page.waitForFunction(() => Number(document.getElementById('throughput')!.dataset.points) >= 3, null, { timeout: 10_000, polling: 100 });
    const charts = await page.evaluate(() =>
      ['throughput', 'rate'].map((id) => {
        const svg = document.getElementById(id)!;
        return {
          points: Number(svg.dataset.points),
          max: Number(svg.dataset.max),
          lines: [...svg.querySelectorAll('polyline')].map((p) => ({ series: p.dataset.series, pairs: p.getAttribute('points')!.trim().split(/\s+/).length })),
        };
      }),
    );
    const [throughput, rate] = charts;
    assert.ok(throughput.max > 0, `the throughput chart has the tunnel's bytes: ${JSON.stringify(throughput)}`);
    assert.ok(throughput.lines.some((l) => l.series === 'inboundBps' && l.pairs >= 3), JSON.stringify(throughput));
    assert.ok(throughput.lines.some((l) => l.series === 'outboundBps' && l.pairs >= 3), JSON.stringify(throughput));
    assert.ok(rate.max > 0 && rate.lines.some((l) => l.series === 'deniedPs' && l.pairs >= 3), JSON.stringify(rate));

    // The policy impact preview, from the page: replacing deny-9090 by a DENY of 8080 would close the open tunnel and
    // allow the attempt just denied on 9090.
    await page.fill('#preview-policy', 'name: deny-9090\nnamespace: default\nscope: Namespace\naction: Deny\nrules: [[[{destinationPorts: [8080]}]]]\n');
    await page.click('#preview-run');
    await shows('#preview-summary', ['default/deny-9090: would close 1 live connection(s), would allow 1 recently denied attempt(s)']);
    await shows('#preview-close tr', ['default/echo', `${ECHO}:${PORT}`, ID.sleep, 'HBONE', 'allow', 'deny', 'default/deny-9090 rule 0']);
    await shows('#preview-allow tr', ['default/echo', `${ECHO}:${DENIED_PORT}`, ID.sleep, 'deny', 'allow']);
    // Nothing was applied: the tunnel still carries bytes.
    await echoOnce(tunnel.socket, Buffer.from('still open'));

    // The README's picture (DASHBOARD_SCREENSHOT=docs) gets half a minute of traffic first, so its charts have a shape.
    if (process.env.DASHBOARD_SCREENSHOT === 'docs') await traffic(30_000);

    mkdirSync(join(ROOT, 'test-results'), { recursive: true });
    await page.screenshot({ path: SCREENSHOT, fullPage: true });
    console.log(`dashboard screenshot: ${SCREENSHOT} (${statSync(SCREENSHOT).size} bytes)`);
    if (process.env.DASHBOARD_SCREENSHOT === 'docs') copyFileSync(SCREENSHOT, join(ROOT, 'docs', 'dashboard.png'));

    tunnel.socket.destroy();
    assert.deepEqual(browser.blocked, [], 'the page asked for nothing beyond the admin port');
    assert.deepEqual(pageErrors, [], 'no script error and no Content-Security-Policy violation');
    console.log(`dashboard checks took ${Date.now() - started} ms`);
  });
}
