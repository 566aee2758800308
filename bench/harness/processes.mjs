// The processes a harness run starts (load servers, daemons, Envoys, the fake CNI agents): tracked so that all of
// them stop with the run whatever ends it, waited for until they are ready, and asked over HTTP (a TCP address, or
// a unix socket for an Envoy whose admin lives in another network namespace).
import { request } from 'node:http';

/** Resolves when `child` prints a line matching `pattern`; rejects if it exits first or after `ms`. */
export function waitLine(child, pattern, what, ms = 20_000) {
  return new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error(`${what} did not start in ${ms} ms: ${out.slice(-2000)}`)), ms);
    const on = (d) => {
      out += d;
      const m = pattern.exec(out);
      if (m) {
        clearTimeout(timer);
        resolve(m);
      }
    };
    child.stdout?.on('data', on);
    child.stderr?.on('data', on);
    child.once('exit', (code, signal) => {
      clearTimeout(timer);
      reject(new Error(`${what} exited (${code ?? signal}): ${out.slice(-2000)}`));
    });
  });
}

/** GET `path` from `base` (`http://host:port` or `unix:/path/to/socket`); resolves { status, body }. */
export function httpGet(base, path, ms = 5_000) {
  return new Promise((resolve, reject) => {
    const url = base.startsWith('unix:') ? null : new URL(path, base);
    const where = url ? { host: url.hostname, port: url.port, path: url.pathname + url.search } : { socketPath: base.slice('unix:'.length), path };
    const req = request({ ...where, agent: false, timeout: ms }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d) => (body += d));
      res.on('end', () => resolve({ status: res.statusCode, body }));
      res.on('error', reject);
    });
    req.on('timeout', () => req.destroy(new Error(`GET ${base}${path}: no answer within ${ms} ms`)));
    req.on('error', reject);
    req.end();
  });
}

/** A count given on the command line: a whole number of at least `min`; otherwise an error naming the option. */
export function wholeNumber(option, text, min = 0) {
  const n = Number(text);
  if (text === undefined || text === '' || !Number.isInteger(n) || n < min) {
    throw new Error(`${option} takes a whole number of at least ${min}, not ${JSON.stringify(text ?? null)}`);
  }
  return n;
}

/** Polls GET base+path every `every` ms until `ok(status, body)`; throws after `ms` with the last answer. */
export async function poll(base, path, ok, what, ms = 30_000, every = 100) {
  const deadline = Date.now() + ms;
  let last = 'no answer';
  while (Date.now() < deadline) {
    try {
      const r = await httpGet(base, path);
      if (ok(r.status, r.body)) return;
      last = `${r.status} ${r.body.trim().slice(0, 200)}`;
    } catch (err) {
      last = err.message;
    }
    await new Promise((r) => setTimeout(r, every));
  }
  throw new Error(`${what} not ready after ${ms} ms (${last})`);
}

/** Keeps the last lines a child wrote to stderr, for error messages. */
function tailOf(child) {
  const lines = [];
  child.stderr?.on('data', (d) => {
    lines.push(...String(d).split('\n').filter(Boolean));
    if (lines.length > 40) lines.splice(0, lines.length - 40);
  });
  return () => lines.join('\n');
}

/** SIGTERM to `c` if it still runs (SIGKILL after 5 s); resolves once it has exited. */
function end(c) {
  return new Promise((resolve) => {
    if (c.exitCode !== null || c.signalCode !== null) return resolve();
    c.once('exit', resolve);
    c.kill('SIGTERM');
    setTimeout(() => c.kill('SIGKILL'), 5_000).unref();
  });
}

/** The children of one run. Each has `tail()` (its last stderr lines) and `what`. */
export class Children {
  constructor() {
    this.list = [];
    this.stopping = false;
    // Last resort: nothing of ours outlives the harness, whatever ends it.
    this.killAll = () => this.list.forEach((c) => c.kill('SIGKILL'));
    process.once('exit', this.killAll);
  }

  track(child, what) {
    this.list.push(child);
    child.tail = tailOf(child);
    child.what = what;
    return child;
  }

  /** From now on, a child that exits is reported: it died during the run. */
  watch() {
    for (const c of this.list) {
      c.once('exit', (code, signal) => {
        if (!this.stopping && !c.retired) process.stderr.write(`bench: ${c.what} exited (${code ?? signal}) during the run\n${c.tail()}\n`);
      });
    }
  }

  /** SIGTERM to every child still running (SIGKILL after 5 s); resolves once all have exited. */
  async stop() {
    this.stopping = true;
    await Promise.all(this.list.map(end));
    process.removeListener('exit', this.killAll);
  }

  /** Stops one child before the run ends (its part is done), without reporting its exit. */
  async retire(child) {
    child.retired = true;
    await end(child);
  }
}
