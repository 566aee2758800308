// The error catalog (native prefixes → codes), the plain log format, and the Drain.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { ERROR_CATALOG, ZtunnelError, fromNativeError, isConfigError, ConfigError } from '../../dist/errors.js';
import { createLogs, toPlain } from '../../dist/log/logger.js';
import { Drain } from '../../dist/lifecycle/drain.js';
import type { ErrorCode } from '../../dist/errors.js';
import type { DrainMode } from '../../dist/lifecycle/drain.js';

test('native error prefixes map to stable codes; the prefix is stripped', () => {
  // Every code of the Rust enum (native/mesh/src/error_code.rs, generated as NativeErrorCode).
  const rust = readFileSync(new URL('../../native/mesh/src/error_code.rs', import.meta.url), 'utf8');
  const codes = [...rust.matchAll(/=> "([A-Z_]+)",/g)].map((m) => m[1] as ErrorCode);
  assert.ok(codes.includes('INVALID_CRL') && codes.includes('PROFILE') && codes.length >= 15, codes.join());
  for (const code of codes) {
    const e = fromNativeError(new Error(`${code}: something about ${code}`));
    assert.ok(e instanceof ZtunnelError);
    assert.equal(e.code, code);
    assert.equal(e.message, `something about ${code}`);
    assert.equal(e.retryable, ERROR_CATALOG[code].retryable);
  }
  assert.equal(fromNativeError(new Error('BIND_FAILED: 127.0.0.1:15008: in use')).retryable, true);
  assert.equal(fromNativeError(new Error('CSR_INVALID: bad')).retryable, false);
  const unknown = fromNativeError(new Error('panic in thread'));
  assert.deepEqual([unknown.code, unknown.message], ['NATIVE_ERROR', 'panic in thread']);
  assert.equal(isConfigError(new ConfigError('x')), true);
  assert.equal(isConfigError(unknown), false);
});

test('plain log lines: time, level, target, message, key=value', () => {
  const line = toPlain('{"level":"info","time":"2025-01-01T00:00:00.000Z","target":"access","message":"connection complete","src.addr":"1.2.3.4:5","bytes_sent":10,"error":"peer closed early"}');
  assert.equal(line, '2025-01-01T00:00:00.000Z  info  access  connection complete  src.addr=1.2.3.4:5  bytes_sent=10  error="peer closed early"\n');
});

test('per-target levels follow the filter', () => {
  const lines: { target: string; level: string; message: string }[] = [];
  const logs = createLogs({ filter: { level: 'warn', targets: { access: 'info' } }, format: 'json', sink: { write: (l) => lines.push(JSON.parse(l)) } });
  logs.root.info('hidden');
  logs.forTarget('access').info('shown');
  logs.root.warn('also shown');
  assert.deepEqual(lines.map((l) => [l.target, l.level, l.message]), [['access', 'info', 'shown'], ['ztunnel', 'warn', 'also shown']]);
  logs.setFilter({ level: 'off', targets: {} });
  logs.forTarget('access').error('silenced');
  assert.equal(lines.length, 2);
});

test('drain: watchers run once, the signal aborts, a stuck watcher cannot hold past the deadline', async () => {
  const logger = createLogs({ filter: { level: 'off', targets: {} }, format: 'json', sink: { write: () => {} } }).root;
  const drain = new Drain(50, logger);
  const seen: [DrainMode, number][] = [];
  drain.watch('quick', (mode, deadline) => void seen.push([mode, deadline]));
  drain.watch('stuck', () => new Promise(() => {}));
  drain.watch('throws', () => {
    throw new Error('ignored');
  });
  assert.equal(drain.signal.aborted, false);
  const started = Date.now();
  const p1 = drain.trigger('graceful', 'test');
  const p2 = drain.trigger('immediate', 'again');
  assert.equal(p1, p2);
  assert.equal(drain.signal.aborted, true);
  const keep = setInterval(() => {}, 100); // the overrun timer is unref'd
  await p1;
  clearInterval(keep);
  assert.deepEqual(seen, [['graceful', 50]]);
  assert.equal(drain.mode, 'graceful');
  assert.ok(Date.now() - started >= 50, 'waited for the deadline');
});
