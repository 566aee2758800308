// A real headless browser for the suites that test a page: Debian's `chromium` (.ci/run installs it), driven by
// playwright-core (a devDependency, pinned; it never downloads a browser). Offline by construction: every request
// the page makes to anything but a loopback address is aborted and recorded, so a page that needs the internet (a
// CDN, a web font) fails its test instead of passing on a connected machine.
//
//   const chromium = chromiumForSuite('the dashboard');   // null: not installed (a failure under CI)
//   const b = await openOffline(chromium);
//   const page = await b.context.newPage();
//   ...
//   assert.deepEqual(b.blocked, []);
//   await b.close();
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { isIP } from 'node:net';
import { test } from 'node:test';
import type { Browser, BrowserContext, ViewportSize } from 'playwright-core';

/** Where Debian puts it (the wrapper first: it sets the distribution's flags); CHROMIUM_PATH overrides. */
const CANDIDATES = ['/usr/bin/chromium', '/usr/lib/chromium/chromium'];

export function chromiumPath(): string | null {
  const chosen = process.env.CHROMIUM_PATH;
  if (chosen) return existsSync(chosen) ? chosen : null;
  return CANDIDATES.find((p) => existsSync(p)) ?? null;
}

/**
 * The browser for a suite that needs it: its path, or null after registering `title` as a test that fails under CI
 * (.ci/run installs chromium: a missing one there is a failure) and is skipped, with the reason, elsewhere.
 */
export function chromiumForSuite(title: string): string | null {
  const path = chromiumPath();
  if (path !== null) return path;
  const unavailable = `chromium is missing (${process.env.CHROMIUM_PATH ? `CHROMIUM_PATH=${process.env.CHROMIUM_PATH}` : CANDIDATES.join(', ')}; Debian chromium: apt-get install --no-install-recommends chromium)`;
  test(title, { skip: process.env.CI ? false : unavailable }, () => {
    assert.fail(`${unavailable}: .ci/run installs it`);
  });
  return null;
}

function isLoopback(hostname: string): boolean {
  const host = hostname.replace(/^\[|\]$/g, '');
  if (host === 'localhost') return true;
  if (isIP(host) === 4) return host.startsWith('127.');
  return host === '::1';
}

export interface OpenOfflineOptions {
  /** Default 1280×900. */
  viewport?: ViewportSize;
}

/** A launched headless browser whose context aborts (and records) every request off loopback. */
export interface OfflineBrowser {
  browser: Browser;
  context: BrowserContext;
  /** The URLs refused, in order. */
  blocked: string[];
  close(): Promise<void>;
}

/**
 * Launches the browser headless with a context whose every non-loopback request is aborted. Resolves
 * `{ browser, context, blocked, close }`; `blocked` lists the URLs refused. As root (CI) chromium needs --no-sandbox.
 */
export async function openOffline(executablePath: string, { viewport = { width: 1280, height: 900 } }: OpenOfflineOptions = {}): Promise<OfflineBrowser> {
  const { chromium } = await import('playwright-core');
  const asRoot = typeof process.getuid === 'function' && process.getuid() === 0;
  const browser = await chromium.launch({
    executablePath,
    headless: true,
    args: [...(asRoot ? ['--no-sandbox'] : []), '--disable-gpu', '--disable-dev-shm-usage', '--disable-background-networking', '--disable-component-update'],
  });
  const context = await browser.newContext({ viewport, deviceScaleFactor: 1, serviceWorkers: 'block' });
  const blocked: string[] = [];
  await context.route('**/*', (route) => {
    const url = new URL(route.request().url());
    if ((url.protocol === 'http:' || url.protocol === 'https:' || url.protocol === 'ws:') && !isLoopback(url.hostname)) {
      blocked.push(url.href);
      return route.abort('internetdisconnected');
    }
    return route.continue();
  });
  return { browser, context, blocked, close: () => browser.close() };
}
