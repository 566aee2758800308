// Drain (ztunnel's drain.rs): one trigger, many watchers, a deadline.
//
// - `trigger(mode)` starts the drain once; later calls return the same promise (the first mode wins; a second
//   SIGINT is handled by the signal handler exiting the process, not by re-draining).
// - Each watcher is work that must finish before shutdown (close a listener, drain the dataplane): the daemon's
//   components' stops (daemon.ts). They are begun in reverse order of registration (the last started is the first
//   stopped) and run concurrently; each receives the mode and the deadline; `signal` is aborted at trigger so loops
//   and retries stop.
// - The drain completes when every watcher has finished, or at deadline + DRAIN_OVERRUN_MS, whichever is first:
//   a stuck watcher cannot hold the process past what the kubelet will allow anyway.
import type { Logger } from 'pino';

export type DrainMode = 'graceful' | 'immediate';

/** Time a watcher gets after the deadline to force-close what is left, before the drain stops waiting. */
export const DRAIN_OVERRUN_MS = 1_000;

export type DrainWatcher = (mode: DrainMode, deadlineMs: number) => Promise<void> | void;

export class Drain {
  private readonly controller = new AbortController();
  private readonly watchers: Array<{ name: string; fn: DrainWatcher }> = [];
  private started: Promise<void> | null = null;
  private drainMode: DrainMode | null = null;

  constructor(readonly deadlineMs: number, private readonly logger: Logger) {}

  /** Aborted when the drain starts. */
  get signal(): AbortSignal {
    return this.controller.signal;
  }

  get mode(): DrainMode | null {
    return this.drainMode;
  }

  /** Registers work to do at drain. Watchers added after the trigger run immediately. */
  watch(name: string, fn: DrainWatcher): void {
    if (this.started) {
      // run() logs a failed step itself and never rejects.
      this.run(name, fn, this.drainMode ?? 'immediate').catch(() => undefined);
      return;
    }
    this.watchers.push({ name, fn });
  }

  /** Starts the drain (idempotent) and resolves when it is complete. */
  trigger(mode: DrainMode, reason: string): Promise<void> {
    if (this.started) return this.started;
    this.drainMode = mode;
    this.logger.info({ mode, reason, deadlineMs: this.deadlineMs }, 'draining');
    this.controller.abort();
    const deadline = mode === 'immediate' ? 0 : this.deadlineMs;
    const pending = new Set(this.watchers.map((w) => w.name));
    const all = Promise.all(
      [...this.watchers].reverse().map(async (w) => {
        await this.run(w.name, w.fn, mode);
        pending.delete(w.name);
      }),
    ).then(() => undefined);
    let timer: NodeJS.Timeout | undefined;
    const overrun = new Promise<void>((resolve) => {
      timer = setTimeout(() => {
        this.logger.warn({ pending: [...pending].sort() }, 'drain deadline passed; not waiting any longer');
        resolve();
      }, deadline + DRAIN_OVERRUN_MS);
      timer.unref();
    });
    this.started = Promise.race([all, overrun]).finally(() => clearTimeout(timer));
    return this.started;
  }

  private async run(name: string, fn: DrainWatcher, mode: DrainMode): Promise<void> {
    try {
      await fn(mode, mode === 'immediate' ? 0 : this.deadlineMs);
    } catch (err) {
      this.logger.error({ watcher: name, err: err instanceof Error ? err.message : String(err) }, 'drain step failed');
    }
  }
}
