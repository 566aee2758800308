// Drives the fake istio-cni agent (fake_cni.py) from Node: start it on a socket path, send ZDS commands, await
// the agent's replies. Used by the namespace suite and the captured-mode benchmark.
import { spawn, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import type { Readable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { PYTHON } from './prereqs.js';

/** This directory in the source tree (fake_cni.py is not compiled): the same path from test/ and dist-test/. */
const here = fileURLToPath(new URL('../../test/helpers/', import.meta.url));

/** A JSON line's object, its fields as yet unchecked. */
export type JsonRecord = Record<string, unknown>;

/**
 * Calls `onLine` with each JSON line a child prints on stdout (other lines are ignored). `T`: what the child prints
 * (a record of its own protocol); the lines are not checked against it.
 */
export function jsonLines<T = JsonRecord>(child: { stdout: Readable }, onLine: (value: T) => void): void {
  createInterface({ input: child.stdout }).on('line', (l) => {
    try {
      onLine(JSON.parse(l));
    } catch {
      // not JSON
    }
  });
}

/**
 * A line of the fake CNI agent (fake_cni.py): `listening`; `connected` (a daemon's ZdsHello, `hello` its hex);
 * `closed`; `ack` of `op` (`uid`, `error`: '' when the daemon accepted it); `disconnected` during `op`; `error`
 * (`message`, and `op` when a command failed). `taken` once a `next` has returned it.
 */
export interface CniEvent {
  event: 'listening' | 'connected' | 'closed' | 'ack' | 'disconnected' | 'error';
  hello?: string;
  op?: string;
  uid?: string | null;
  error?: string;
  message?: string;
  taken?: boolean;
}

/** A command for the fake CNI agent: `add` (a pod: uid, netns path, name, namespace, serviceAccount), `del` and
 * `keep` (uid), `snapshot`, `close` (the ZDS connection). */
export interface CniCommand {
  op: string;
  uid?: string;
  netns?: string;
  name?: string;
  namespace?: string;
  serviceAccount?: string;
}

/** A running fake CNI agent (`startCni`). */
export interface CniAgent {
  /** Every line it printed, in order. */
  events: CniEvent[];
  /** The first event (past or future, not yet taken) matching `match`; rejects after `ms` (default 20 s). */
  next(match: (event: CniEvent) => unknown, what: string, ms?: number): Promise<CniEvent>;
  /** Writes one command and resolves the agent's reply (for `close`: the `closed` event). */
  send(cmd: CniCommand): Promise<CniEvent>;
}

/**
 * Starts the fake CNI agent listening on `sock`; the child is pushed to `children` (the caller kills them).
 * Returns { events, next(match, what, ms), send(cmd) }: `send` writes one command and resolves the agent's reply.
 */
export function startCni(sock: string, children: ChildProcess[]): CniAgent {
  const child = spawn(PYTHON, [join(here, 'fake_cni.py'), sock], { stdio: ['pipe', 'pipe', 'inherit'] });
  children.push(child);
  const events: CniEvent[] = [];
  const waiters: { match: (event: CniEvent) => unknown; resolve: (event: CniEvent) => void }[] = [];
  jsonLines(child, (ev: CniEvent) => {
    events.push(ev);
    for (const w of [...waiters]) {
      if (w.match(ev)) {
        waiters.splice(waiters.indexOf(w), 1);
        w.resolve(ev);
      }
    }
  });
  const next = (match: (event: CniEvent) => unknown, what: string, ms = 20_000) =>
    new Promise<CniEvent>((resolve, reject) => {
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
    async send(cmd: CniCommand) {
      child.stdin.write(JSON.stringify(cmd) + '\n');
      if (cmd.op === 'close') return next((e) => e.event === 'closed', 'close');
      return next((e) => e.op === cmd.op && (e.event === 'ack' || e.event === 'error' || e.event === 'disconnected'), `reply to ${cmd.op}`);
    },
  };
}

