// Keeps one certificate per local identity installed in the dataplane: CSR (key stays in Rust) -> CA -> install.
//
// Invariants:
// - At most one fetch per identity is in flight: `createCsr` replaces the pending key, so two overlapping
//   fetches would make the first install fail with CERT_MISMATCH.
// - A certificate is refreshed at half its lifetime (as ztunnel does); a failed fetch is retried with
//   exponential backoff, and a failed refresh keeps serving the current certificate while it is still valid.
// - Timers are unref'd: certificates never keep the process alive; `stop()` cancels them all.
import type { Logger } from 'pino';
import type { CertificateAuthority } from './authority.js';
import { describeCertificate, leafValidity, splitPem, type CertificateDump } from './pem.js';

/** First retry after a failed fetch; short, because the usual cause (CA starting up) clears quickly. */
export const RETRY_INITIAL_MS = 500;
/** Backoff ceiling: a CA outage should not turn into a request storm, nor leave a workload without a cert long. */
export const RETRY_MAX_MS = 30_000;
/** setTimeout's maximum delay; longer refresh delays (TTL > ~49 days) are re-armed in steps. */
const MAX_TIMER_MS = 2 ** 31 - 1;

/** The part of the dataplane the manager needs (a fake in tests). */
export interface KeyStore {
  createCsr(identity: string): string;
  installCertificate(identity: string, chainPem: string, rootsPem: string): void;
}

export type CertificateState = 'Initializing' | 'Available' | `Unavailable: ${string}`;

interface Entry {
  identity: string;
  state: CertificateState;
  chainPem: string | null;
  rootsPem: string | null;
  notAfter: number | null;
  timer: NodeJS.Timeout | null;
  inflight: Promise<void> | null;
  failures: number;
  waiters: Array<(available: boolean) => void>;
}

export interface CertificateManagerOptions {
  keys: KeyStore;
  ca: CertificateAuthority;
  ttlSeconds: number;
  logger: Logger;
  now?: () => number;
}

export interface IdentityDump {
  identity: string;
  state: CertificateState;
  certChain: CertificateDump[];
  rootCerts: CertificateDump[];
}

export class CertificateManager {
  private readonly entries = new Map<string, Entry>();
  private stopped = false;
  private readonly now: () => number;

  constructor(private readonly opts: CertificateManagerOptions) {
    this.now = opts.now ?? Date.now;
  }

  /**
   * Starts tracking `identity` (idempotent) and resolves true once it has a certificate, or false if the
   * manager is stopped first. Failures are retried forever; watch `dump()` or the logs for the reason.
   */
  ensure(identity: string): Promise<boolean> {
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
        inflight: null,
        failures: 0,
        waiters: [],
      };
      this.entries.set(identity, entry);
      this.fetch(entry);
    }
    if (entry.state === 'Available') return Promise.resolve(true);
    const e = entry;
    return new Promise((resolve) => e.waiters.push(resolve));
  }

  /** Stops refreshing `identity` and drops it from the dump. */
  forget(identity: string): void {
    const entry = this.entries.get(identity);
    if (!entry) return;
    if (entry.timer) clearTimeout(entry.timer);
    this.entries.delete(identity);
    for (const w of entry.waiters.splice(0)) w(false);
  }

  stop(): void {
    this.stopped = true;
    for (const identity of [...this.entries.keys()]) {
      const entry = this.entries.get(identity) as Entry;
      if (entry.timer) clearTimeout(entry.timer);
      entry.timer = null;
      for (const w of entry.waiters.splice(0)) w(false);
    }
  }

  /** config_dump `certificates`, sorted by identity. */
  dump(): IdentityDump[] {
    return [...this.entries.values()]
      .sort((a, b) => (a.identity < b.identity ? -1 : a.identity > b.identity ? 1 : 0))
      .map((e) => ({
        identity: e.identity,
        state: e.state,
        certChain: e.chainPem ? splitPem(e.chainPem).map(describeCertificate) : [],
        rootCerts: e.rootsPem ? splitPem(e.rootsPem).map(describeCertificate) : [],
      }));
  }

  private fetch(entry: Entry): void {
    if (this.stopped || entry.inflight || this.entries.get(entry.identity) !== entry) return;
    entry.inflight = this.fetchOnce(entry).finally(() => {
      entry.inflight = null;
    });
  }

  private async fetchOnce(entry: Entry): Promise<void> {
    const { keys, ca, ttlSeconds, logger } = this.opts;
    try {
      const csr = keys.createCsr(entry.identity);
      const signed = await ca.sign(csr, entry.identity, ttlSeconds);
      if (this.stopped || this.entries.get(entry.identity) !== entry) return;
      keys.installCertificate(entry.identity, signed.chainPem, signed.rootsPem);
      const { notBefore, notAfter } = leafValidity(signed.chainPem);
      entry.chainPem = signed.chainPem;
      entry.rootsPem = signed.rootsPem;
      entry.notAfter = notAfter.getTime();
      entry.state = 'Available';
      entry.failures = 0;
      const refreshAt = notBefore.getTime() + (notAfter.getTime() - notBefore.getTime()) / 2;
      logger.info({ identity: entry.identity, expiration: notAfter.toISOString() }, 'certificate installed');
      this.schedule(entry, refreshAt - this.now());
      for (const w of entry.waiters.splice(0)) w(true);
    } catch (err) {
      if (this.stopped || this.entries.get(entry.identity) !== entry) return;
      const message = err instanceof Error ? err.message : String(err);
      const stillValid = entry.notAfter !== null && entry.notAfter > this.now();
      // A failed refresh does not take away a certificate that still works.
      if (!stillValid) entry.state = `Unavailable: ${message}`;
      const delay = Math.min(RETRY_INITIAL_MS * 2 ** entry.failures, RETRY_MAX_MS);
      entry.failures++;
      logger.warn(
        { identity: entry.identity, err: message, code: (err as { code?: string }).code, retryInMs: delay },
        'certificate fetch failed',
      );
      this.schedule(entry, delay);
    }
  }

  private schedule(entry: Entry, delayMs: number): void {
    if (entry.timer) clearTimeout(entry.timer);
    const delay = Math.max(0, delayMs);
    const step = Math.min(delay, MAX_TIMER_MS);
    entry.timer = setTimeout(() => {
      entry.timer = null;
      if (delay > step) this.schedule(entry, delay - step);
      else this.fetch(entry);
    }, step);
    entry.timer.unref();
  }
}
