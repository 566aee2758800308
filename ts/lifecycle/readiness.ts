// Readiness is the set of named tasks still pending (ztunnel's readiness.rs): the proxy is ready when every
// registered task has reported done. Names are what an operator sees in `not ready, pending: ...`.

export interface PendingTask {
  readonly name: string;
  /** Marks the task done. Idempotent. */
  done(): void;
}

export class Readiness {
  // A name may be registered more than once (e.g. one task per identity); it stays pending until all are done.
  private readonly pendingCounts = new Map<string, number>();
  private readonly waiters: (() => void)[] = [];

  register(name: string): PendingTask {
    this.pendingCounts.set(name, (this.pendingCounts.get(name) ?? 0) + 1);
    let finished = false;
    return {
      name,
      done: () => {
        if (finished) return;
        finished = true;
        const left = (this.pendingCounts.get(name) ?? 1) - 1;
        if (left <= 0) this.pendingCounts.delete(name);
        else this.pendingCounts.set(name, left);
        if (this.pendingCounts.size === 0) for (const wake of this.waiters.splice(0)) wake();
      },
    };
  }

  /** Pending task names, sorted. */
  pending(): string[] {
    return [...this.pendingCounts.keys()].sort();
  }

  isReady(): boolean {
    return this.pendingCounts.size === 0;
  }

  /** Resolves once nothing is pending (at once if nothing is). */
  whenReady(): Promise<void> {
    if (this.isReady()) return Promise.resolve();
    return new Promise((resolve) => this.waiters.push(resolve));
  }
}

/** The /healthz/ready answer for a set of pending tasks, byte for byte as ztunnel's. */
export function renderReadiness(pending: readonly string[]): { status: number; body: string } {
  if (pending.length === 0) return { status: 200, body: 'ready\n' };
  return { status: 500, body: `not ready, pending: ${[...pending].sort().join(', ')}\n` };
}
