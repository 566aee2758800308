// Drives the fake istio-cni agent (fake_cni.py) from Node: start it on a socket path, send ZDS commands, await
// the agent's replies. Used by the namespace suite and the captured-mode benchmark.
import { spawn } from 'node:child_process';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));

/** Calls `onLine` with each JSON line a child prints on stdout (other lines are ignored). */
export function jsonLines(child, onLine) {
  createInterface({ input: child.stdout }).on('line', (l) => {
    try {
      onLine(JSON.parse(l));
    } catch {
      // not JSON
    }
  });
}

/**
 * Starts the fake CNI agent listening on `sock`; the child is pushed to `children` (the caller kills them).
 * Returns { events, next(match, what, ms), send(cmd) }: `send` writes one command and resolves the agent's reply.
 */
export function startCni(sock, children) {
  const child = spawn('python3', [join(here, 'fake_cni.py'), sock], { stdio: ['pipe', 'pipe', 'inherit'] });
  children.push(child);
  const events = [];
  const waiters = [];
  jsonLines(child, (ev) => {
    events.push(ev);
    for (const w of [...waiters]) {
      if (w.match(ev)) {
        waiters.splice(waiters.indexOf(w), 1);
        w.resolve(ev);
      }
    }
  });
  const next = (match, what, ms = 20_000) =>
    new Promise((resolve, reject) => {
      const found = events.find((e) => match(e) && !e.taken);
      if (found) {
        found.taken = true;
        return resolve(found);
      }
      const t = setTimeout(() => reject(new Error(`fake CNI: no ${what} within ${ms} ms; saw ${JSON.stringify(events)}`)), ms);
      waiters.push({ match: (e) => match(e) && !e.taken && (e.taken = true), resolve: (e) => (clearTimeout(t), resolve(e)) });
    });
  return {
    events,
    next,
    async send(cmd) {
      child.stdin.write(JSON.stringify(cmd) + '\n');
      if (cmd.op === 'close') return next((e) => e.event === 'closed', 'close');
      return next((e) => e.op === cmd.op && (e.event === 'ack' || e.event === 'error' || e.event === 'disconnected'), `reply to ${cmd.op}`);
    },
  };
}

