// The admin port's live view (admin/dashboard.ts) as a component: its module, and the page it serves, load with the
// first request for it; it reads what the daemon has, and the events the pump drains, only while a page watches.
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Dashboard, DashboardSource } from '../admin/dashboard.js';
import { reply } from '../admin/http.js';
import type { NativeEvent } from '../native/types.js';
import type { Component } from './daemon.js';

export class DashboardComponent implements Component {
  readonly name = 'dashboard';
  private current: Dashboard | null = null;
  private loading: Promise<Dashboard> | null = null;
  private stopped = false;

  constructor(private readonly source: DashboardSource) {}

  start(): void {}

  /** Its streams never end on their own: they end here. */
  stop(): void {
    this.stopped = true;
    this.current?.close();
  }

  /** The admin server's handler for /dashboard and its events stream. */
  serve(req: IncomingMessage, res: ServerResponse, path: string, refused: string | null): void {
    this.open().then(
      (d) => {
        // A stream that would start after the stop would never be ended.
        if (this.stopped) return reply(res, 503, 'shutting down\n');
        d.serve(req, res, path, refused);
      },
      (err: unknown) => reply(res, 500, `the dashboard failed to load: ${err instanceof Error ? err.message : String(err)}\n`),
    );
  }

  /** A batch of the dataplane's events (the event pump's sink). */
  observe(events: NativeEvent[]): void {
    this.current?.observe(events);
  }

  private open(): Promise<Dashboard> {
    return (this.loading ??= import('../admin/dashboard.js').then(({ Dashboard }) => (this.current = new Dashboard(this.source))));
  }
}
