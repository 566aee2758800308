// The daemon as components (ts/lifecycle/proxy.ts composes them): each part of the daemon that holds something to
// undo (servers, the dataplane, certificates, the mesh sources, capture, the dashboard) is a Component with start()
// and stop(). One Daemon starts them in order and stops them in reverse, so a start that fails part-way and a drain
// take the same path: the drain (drain.ts) stops what was started, and nothing else is kept in step by hand.
import type { Drain, DrainMode } from './drain.js';

export interface Component {
  /** Named in the drain's log (a stop still pending at the deadline is listed by it). */
  readonly name: string;
  /** Sets the component up; may assume every component started before it is up. */
  start(): Promise<void> | void;
  /**
   * Undoes start(), also a start that failed or was cut short part-way (it checks what it has). `deadlineMs` is what
   * the drain allows (0 when immediate: a failed start, a fatal error, a second signal).
   */
  stop(mode: DrainMode, deadlineMs: number): Promise<void> | void;
}

/**
 * Starts components in order; their stops join the drain, which begins them in reverse start order and runs them
 * concurrently under its one deadline (as ztunnel's drain: the servers stop accepting while the dataplane drains its
 * connections; an order one stop needs inside itself is that component's own). A component's stop waits for its own
 * start to settle, so a drain that begins while a start runs undoes what the start made, not what it had made so far.
 */
export class Daemon {
  constructor(private readonly drain: Drain) {}

  /** Whether the drain has begun (nothing is started after that). */
  get stopping(): boolean {
    return this.drain.signal.aborted;
  }

  /**
   * Starts `components` one after the other. Resolves false when the drain began first (those left are not started);
   * rejects with a start's error, that component's stop already joined to the drain (the caller drains).
   */
  async start(...components: Component[]): Promise<boolean> {
    for (const c of components) {
      if (this.stopping) return false;
      let settled: Promise<unknown> = Promise.resolve();
      // Joined before it starts: a start that throws or is overtaken by the drain is stopped all the same.
      this.drain.watch(c.name, async (mode, deadlineMs) => {
        await settled;
        await c.stop(mode, deadlineMs);
      });
      const started = Promise.resolve().then(() => c.start());
      settled = started.catch(() => undefined);
      await started;
    }
    return !this.stopping;
  }
}
