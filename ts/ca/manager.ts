// Keeps one certificate per identity installed in the dataplane: CSR (the key stays in Rust) -> CA -> install.
// ztunnel's SecretManager, in TypeScript: the native side asks for nothing per connection, it only
// receives certificates.
//
// Invariants:
// - One state per identity: Initializing, Available, or Unavailable with the error. A failed refresh keeps an
//   unexpired certificate Available (and installed): the dataplane keeps using it.
// - At most one request per identity is in flight (`createCsr` replaces the pending key, so two overlapping
//   requests would make the first install fail), and at most `maxConcurrent` (8) requests overall. Waiting
//   requests leave the queue by priority: RealTime (something waits for it) > Warmup (prefetch for a local
//   workload) > Background (scheduled refresh); ties by time of queueing.
// - Refresh: with `received` = now() when a certificate arrives, it is due at
//     max(half-life, received + min(CERT_MIN_REFRESH_INTERVAL_MS = 5 min, (notAfter - received) / 2))
//   with +-5 % jitter on the delay, clamped to [received + 1 s, notAfter] (`refreshDelayMs`). A 24 h certificate
//   is refreshed at its half-life. The floor exists because CAs backdate notBefore (istiod by 2 min): with a 60 s
//   TTL the half-life is 30 s before issuance, and "half-life" alone re-requests in a loop; with the floor, 60 s
//   of validity is refreshed after ~30 s. It counts from receipt because that is the one time on our own clock,
//   and is capped at half the remaining validity so it never lets a certificate lapse.
// - A certificate with less than 2 x CERT_MIN_REFRESH_DELAY_MS (2 s) of validity when it arrives (expired, or
//   about to) is not installed: it is a failed fetch with backoff (below), so a CA or a clock that hands out dead
//   certificates costs one request per backoff step, never a loop. The previous certificate, if any, stays.
// - A failure retries after a per-identity backoff (1 s doubling to 150 s, +-20 % jitter); with an unexpired
//   certificate the retry is at min(backoff, expiry).
// - `forget` drops an identity (its last local workload left); a response arriving later is discarded.
// - Timers are unref'd (the default `timers`): certificates never keep the process alive; `stop()` cancels them.
import type { Logger } from 'pino';
import {
  CA_BACKOFF_INITIAL_MS,
  CA_BACKOFF_JITTER,
  CA_BACKOFF_MAX_MS,
  CA_MAX_CONCURRENT_REQUESTS,
  CERT_MIN_REFRESH_DELAY_MS,
  CERT_MIN_REFRESH_INTERVAL_MS,
  CERT_REFRESH_JITTER,
} from '../config/defaults.js';
import { ZtunnelError } from '../errors.js';
import type { CertificateAuthority } from './authority.js';
import { describeCertificate, leafValidity, splitPem, type CertificateDump } from './pem.js';

/** setTimeout's maximum delay; longer refresh delays (TTL > ~49 days) are re-armed in steps. */
const MAX_TIMER_MS = 2 ** 31 - 1;

/** Below this much validity at receipt a certificate is refused: half of it would be under the minimum delay. */
const MIN_USABLE_VALIDITY_MS = 2 * CERT_MIN_REFRESH_DELAY_MS;

/**
 * Milliseconds from `received` until the certificate valid [notBefore, notAfter] should be refreshed (all in ms
 * since the epoch; `random` in [0, 1)). The rule is in the invariants above; the result is always within
 * [CERT_MIN_REFRESH_DELAY_MS, notAfter - received] for a certificate the manager accepts.
 */
export function refreshDelayMs(notBefore: number, notAfter: number, received: number, random: number): number {
  const remaining = notAfter - received;
  const toHalfLife = notBefore + (notAfter - notBefore) / 2 - received;
  const floor = Math.min(CERT_MIN_REFRESH_INTERVAL_MS, remaining / 2);
  const delay = Math.max(toHalfLife, floor) * (1 + CERT_REFRESH_JITTER * (2 * random - 1));
  return Math.min(Math.max(delay, CERT_MIN_REFRESH_DELAY_MS), remaining);
}

/** How the manager waits (tests pass a fake clock's timers). The default unrefs Node's timers. */
export interface Timers {
  set(fn: () => void, delayMs: number): unknown;
  clear(handle: unknown): void;
}

const nodeTimers: Timers = {
  set: (fn, delayMs) => setTimeout(fn, delayMs).unref(),
  clear: (handle) => clearTimeout(handle as NodeJS.Timeout),
};

/** The part of the dataplane the manager needs (a fake in tests). */
export interface KeyStore {
  createCsr(identity: string): string;
  installCertificate(identity: string, chainPem: string, rootsPem: string): void;
  /** Frees the identity's key and certificate (called by `forget`). */
  forgetIdentity?(identity: string): void;
}

export type CertificateState = 'Initializing' | 'Available' | `Unavailable: ${string}`;

/** Lower is more urgent. */
export const Priority = { RealTime: 0, Warmup: 1, Background: 2 } as const;
export type PriorityName = keyof typeof Priority;

interface Entry {
  identity: string;
  state: CertificateState;
  chainPem: string | null;
  rootsPem: string | null;
  notAfter: number | null;
  timer: unknown;
  /** queued: waiting for a request slot; inflight: the CA is being asked. */
  phase: 'idle' | 'queued' | 'inflight';
  priority: number;
  queuedAt: number;
  failures: number;
  waiters: Array<(available: boolean) => void>;
}

export interface CertificateManagerOptions {
  keys: KeyStore;
  ca: CertificateAuthority;
  ttlSeconds: number;
  logger: Logger;
  now?: () => number;
  maxConcurrent?: number;
  backoff?: { initialMs: number; maxMs: number; jitter: number };
  /** Jitter of backoffs and refresh times; Math.random by default. */
  random?: () => number;
  /** setTimeout (unref'd) by default. */
  timers?: Timers;
}

export interface IdentityDump {
  identity: string;
  state: CertificateState;
  certChain: CertificateDump[];
  rootCerts: CertificateDump[];
}

export interface CertificateSummary {
  identity: string;
  state: CertificateState;
  notAfter: number | null;
}

export class CertificateManager {
  private readonly entries = new Map<string, Entry>();
  private readonly queue = new Set<Entry>();
  private inflight = 0;
  private seq = 0;
  private stopped = false;
  private readonly now: () => number;
  private readonly random: () => number;
  private readonly timers: Timers;

  constructor(private readonly opts: CertificateManagerOptions) {
    this.now = opts.now ?? Date.now;
    this.random = opts.random ?? Math.random;
    this.timers = opts.timers ?? nodeTimers;
  }

  /**
   * Starts tracking `identity` (idempotent) and resolves true once it has a certificate, or false if the
   * manager is stopped or the identity forgotten first. Failures are retried with backoff; see `dump()`.
   * A more urgent `priority` raises a queued request.
   */
  ensure(identity: string, priority: PriorityName = 'Warmup'): Promise<boolean> {
    if (this.stopped) return Promise.resolve(false);
    let entry = this.entries.get(identity);
    if (entry === undefined) {
      entry = {
        identity,
        state: 'Initializing',
        chainPem: null,
        rootsPem: null,
        notAfter: null,
        timer: null,
        phase: 'idle',
        priority: Priority[priority],
        queuedAt: 0,
        failures: 0,
        waiters: [],
      };
      this.entries.set(identity, entry);
      this.enqueue(entry, Priority[priority]);
    } else if (entry.phase === 'queued') {
      entry.priority = Math.min(entry.priority, Priority[priority]);
    }
    if (entry.state === 'Available') return Promise.resolve(true);
    const e = entry;
    return new Promise((resolve) => e.waiters.push(resolve));
  }

  has(identity: string): boolean {
    return this.entries.has(identity);
  }

  identities(): string[] {
    return [...this.entries.keys()];
  }

  /** Stops refreshing `identity` and drops it from the dump. */
  forget(identity: string): void {
    const entry = this.entries.get(identity);
    if (!entry) return;
    this.cancelTimer(entry);
    this.queue.delete(entry);
    this.entries.delete(identity);
    for (const w of entry.waiters.splice(0)) w(false);
    this.opts.keys.forgetIdentity?.(identity);
    this.opts.logger.info({ identity }, 'certificate forgotten (no local workload uses it)');
  }

  stop(): void {
    this.stopped = true;
    this.queue.clear();
    for (const entry of this.entries.values()) {
      this.cancelTimer(entry);
      for (const w of entry.waiters.splice(0)) w(false);
    }
  }

  /** config_dump `certificates`, sorted by identity. */
  dump(): IdentityDump[] {
    return this.byIdentity().map((e) => ({
      identity: e.identity,
      state: e.state,
      certChain: e.chainPem ? splitPem(e.chainPem).map(describeCertificate) : [],
      rootCerts: e.rootsPem ? splitPem(e.rootsPem).map(describeCertificate) : [],
    }));
  }

  /**
   * Each identity's state and its installed leaf's expiry (ms since the epoch; null before the first), sorted by
   * identity: what `dump()` shows, without decoding certificates (the dashboard reads it every second).
   */
  states(): CertificateSummary[] {
    return this.byIdentity().map((e) => ({ identity: e.identity, state: e.state, notAfter: e.notAfter }));
  }

  private byIdentity(): Entry[] {
    return [...this.entries.values()].sort((a, b) => (a.identity < b.identity ? -1 : a.identity > b.identity ? 1 : 0));
  }

  /** Requests waiting for a slot and in flight (tests, debugging). */
  pending(): { queued: number; inflight: number } {
    return { queued: this.queue.size, inflight: this.inflight };
  }

  private live(entry: Entry): boolean {
    return !this.stopped && this.entries.get(entry.identity) === entry;
  }

  private enqueue(entry: Entry, priority: number): void {
    if (!this.live(entry) || entry.phase !== 'idle') return;
    entry.phase = 'queued';
    entry.priority = priority;
    entry.queuedAt = this.seq++;
    this.queue.add(entry);
    this.pump();
  }

  private pump(): void {
    const max = this.opts.maxConcurrent ?? CA_MAX_CONCURRENT_REQUESTS;
    while (this.inflight < max && this.queue.size > 0) {
      let next: Entry | null = null;
      for (const e of this.queue) {
        if (next === null || e.priority < next.priority || (e.priority === next.priority && e.queuedAt < next.queuedAt)) next = e;
      }
      const entry = next as Entry;
      this.queue.delete(entry);
      entry.phase = 'inflight';
      this.inflight++;
      this.fetchOnce(entry)
        .finally(() => {
          this.inflight--;
          entry.phase = 'idle';
          this.pump();
        })
        // fetchOnce reports its own failures; this is for a bug past it (a rejection left unhandled ends Node).
        .catch((err: unknown) => {
          const message = err instanceof Error ? err.message : String(err);
          this.opts.logger.error({ identity: entry.identity, err: message }, 'certificate fetch failed unexpectedly');
        });
    }
  }

  private async fetchOnce(entry: Entry): Promise<void> {
    const { keys, ca, ttlSeconds, logger } = this.opts;
    try {
      const csr = keys.createCsr(entry.identity);
      const signed = await ca.sign(csr, entry.identity, ttlSeconds);
      if (!this.live(entry)) return;
      const received = this.now();
      const { notBefore, notAfter } = leafValidity(signed.chainPem);
      const validFor = notAfter.getTime() - received;
      if (validFor < MIN_USABLE_VALIDITY_MS) {
        throw new ZtunnelError(
          'CA_UNAVAILABLE',
          `the CA returned a certificate valid until ${notAfter.toISOString()}, ` +
            `${validFor <= 0 ? 'already expired' : `only ${Math.round(validFor)} ms`} when received at ` +
            `${new Date(received).toISOString()} (at least ${MIN_USABLE_VALIDITY_MS} ms needed); ` +
            'not installed (check the CA\'s TTL and the clocks of this node and the CA)',
        );
      }
      keys.installCertificate(entry.identity, signed.chainPem, signed.rootsPem);
      entry.chainPem = signed.chainPem;
      entry.rootsPem = signed.rootsPem;
      entry.notAfter = notAfter.getTime();
      entry.state = 'Available';
      entry.failures = 0;
      const refreshIn = refreshDelayMs(notBefore.getTime(), notAfter.getTime(), received, this.random());
      logger.info(
        { identity: entry.identity, expiration: notAfter.toISOString(), refreshInMs: Math.round(refreshIn) },
        'certificate installed',
      );
      this.schedule(entry, refreshIn, Priority.Background);
      for (const w of entry.waiters.splice(0)) w(true);
    } catch (err) {
      if (!this.live(entry)) return;
      const message = err instanceof Error ? err.message : String(err);
      const remaining = entry.notAfter === null ? 0 : entry.notAfter - this.now();
      // A failed refresh does not take away a certificate that still works.
      if (remaining <= 0) entry.state = `Unavailable: ${message}`;
      const delay = this.backoff(entry.failures++);
      const retryIn = remaining > 0 ? Math.min(delay, remaining) : delay;
      logger.warn(
        { identity: entry.identity, err: message, code: (err as { code?: string }).code, retryInMs: Math.round(retryIn) },
        'certificate fetch failed',
      );
      this.schedule(entry, retryIn, remaining > 0 ? Priority.Background : Priority.Warmup);
    }
  }

  private backoff(failures: number): number {
    const b = this.opts.backoff ?? { initialMs: CA_BACKOFF_INITIAL_MS, maxMs: CA_BACKOFF_MAX_MS, jitter: CA_BACKOFF_JITTER };
    const base = Math.min(b.initialMs * 2 ** failures, b.maxMs);
    return base * (1 - b.jitter + 2 * b.jitter * this.random());
  }

  private cancelTimer(entry: Entry): void {
    if (entry.timer !== null) this.timers.clear(entry.timer);
    entry.timer = null;
  }

  private schedule(entry: Entry, delayMs: number, priority: number): void {
    this.cancelTimer(entry);
    const delay = Math.max(0, delayMs);
    const step = Math.min(delay, MAX_TIMER_MS);
    entry.timer = this.timers.set(() => {
      entry.timer = null;
      if (delay > step) this.schedule(entry, delay - step, priority);
      else this.enqueue(entry, priority);
    }, step);
  }
}
