// How the daemon ends: SIGTERM, SIGINT or POST /quitquitquit start a graceful drain (a second SIGINT exits at once),
// a fatal error an immediate one; `closed` resolves with the exit code once the drain is complete.
import type { Logger } from 'pino';
import type { Drain, DrainMode } from './drain.js';

export class Exit {
  /** The process exit code once shut down: 0 clean, 1 after a fatal error. */
  private code = 0;
  /** Resolves with the exit code once the daemon has shut down. */
  readonly closed: Promise<number>;
  private resolveClosed!: (code: number) => void;
  private removeSignals: () => void = () => undefined;
  // A daemon that handed over under an orchestrator (every mode but local) stays, drained, until its own SIGTERM: one
  // that exits by itself is restarted by the kubelet (restartPolicy Always) and would take over from its successor.
  private signalled = false;
  private releaseHold: (() => void) | null = null;

  constructor(
    private readonly drain: Drain,
    private readonly log: Logger,
    /** Whether the daemon owns the process's signals (the CLI; tests do not). */
    private readonly handleSignals: boolean,
  ) {
    this.closed = new Promise<number>((resolve) => (this.resolveClosed = resolve));
  }

  /** Whether a fatal error has been met (the daemon is on its way out). */
  get failed(): boolean {
    return this.code !== 0;
  }

  /** Starts the drain (idempotent); resolves when it is complete and `closed` has resolved. */
  shutdown(mode: DrainMode = 'graceful', reason = 'requested', holdUntilSignal = false): Promise<void> {
    return this.drain.trigger(mode, reason).then(async () => {
      if (holdUntilSignal && this.handleSignals && !this.signalled) {
        this.log.info('handed over and drained: exiting on SIGTERM (an orchestrator would restart a daemon that exits)');
        // Nothing else keeps the event loop alive now; a signal handler does not.
        const alive = setInterval(() => undefined, 1 << 30);
        await new Promise<void>((resolve) => (this.releaseHold = resolve));
        clearInterval(alive);
      }
      this.removeSignals();
      this.log.info({ exitCode: this.code }, 'shutdown complete');
      this.resolveClosed(this.code);
    });
  }

  /** shutdown() from a callback that cannot wait for it: a failure of the drain itself is logged, and still exits. */
  soon(mode: DrainMode, reason: string, holdUntilSignal = false): void {
    this.shutdown(mode, reason, holdUntilSignal).catch((err: unknown) => {
      this.log.error({ err: err instanceof Error ? err.message : String(err) }, 'shutdown failed');
      this.resolveClosed(1);
    });
  }

  /** A failure the daemon cannot serve through: logged, then an immediate drain and exit code 1. */
  fatal(what: string, err: unknown): void {
    if (this.drain.signal.aborted) return;
    this.log.error({ err: err instanceof Error ? err.message : String(err), code: (err as { code?: string }).code }, `${what}; shutting down`);
    this.code = 1;
    this.soon('immediate', 'fatal error');
  }

  /** Installs the SIGTERM/SIGINT handlers (when the daemon owns the signals); removed once shut down. */
  installSignals(): void {
    if (!this.handleSignals) return;
    const onSignal = (signal: NodeJS.Signals) => {
      this.signalled = true;
      if (this.releaseHold !== null) {
        this.releaseHold();
        return;
      }
      if (this.drain.mode !== null) {
        if (signal === 'SIGINT') {
          this.log.warn('second SIGINT: exiting immediately');
          process.exit(0);
        }
        return;
      }
      this.soon('graceful', signal);
    };
    process.on('SIGTERM', onSignal);
    process.on('SIGINT', onSignal);
    this.removeSignals = () => {
      process.off('SIGTERM', onSignal);
      process.off('SIGINT', onSignal);
    };
  }

  /** Removes the signal handlers (a start that failed: the caller gets the error, the process is not ours to end). */
  release(): void {
    this.removeSignals();
  }
}
