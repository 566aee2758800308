// The admin (15000), stats (15020) and readiness (15021) servers as a component. They bind first, before the local
// config has loaded: a large file takes a while to validate, and they answer throughout (readiness "not ready",
// admin calls that need the dataplane 503).
import type { Server } from 'node:http';
import type { Config } from '../config/index.js';
import { formatSocketAddress, type SocketAddress } from '../config/address.js';
import { createAdminServer, type AdminHandlers } from '../admin/admin-server.js';
import { readinessHandler, takeEarlyReadiness } from '../admin/early-readiness.js';
import { MAX_HTTP_CONNECTIONS, boundAddress, capConnections, closeServer, listen, type ServerName } from '../admin/http.js';
import { Metrics, type MetricsOptions } from '../admin/metrics.js';
import { createReadinessServer } from '../admin/readiness-server.js';
import { createStatsServer } from '../admin/stats-server.js';
import type { Logs } from '../log/logger.js';
import type { Logger } from 'pino';
import type { Component } from './daemon.js';
import type { DrainMode } from './drain.js';
import type { Readiness } from './readiness.js';

export interface ServerAddresses {
  readonly admin: SocketAddress;
  readonly stats: SocketAddress;
  readonly readiness: SocketAddress;
}

/**
 * Connections the admin, stats and readiness servers closed at their cap, per server; logged at most once per
 * 10 s per server, with how many went unlogged.
 */
class DropCounter {
  readonly counts: Record<ServerName, number> = { admin: 0, stats: 0, readiness: 0 };
  private readonly lastLog: Record<ServerName, number> = { admin: 0, stats: 0, readiness: 0 };
  private readonly unlogged: Record<ServerName, number> = { admin: 0, stats: 0, readiness: 0 };
  constructor(private readonly log: Logger) {}
  drop(name: ServerName): void {
    this.counts[name]++;
    this.unlogged[name]++;
    const now = Date.now();
    if (now - this.lastLog[name] < 10_000) return;
    this.log.warn({ server: name, dropped: this.unlogged[name], limit: MAX_HTTP_CONNECTIONS[name] }, 'connections refused at the server\'s connection limit');
    this.lastLog[name] = now;
    this.unlogged[name] = 0;
  }
}

export interface ServersOptions {
  config: Config;
  logs: Logs;
  readiness: Readiness;
  /** The admin API's handlers (its logs are `logs`). */
  admin: Omit<AdminHandlers, 'logs'>;
  /** What /metrics renders (the servers' own dropped connections are added). */
  metrics: Omit<MetricsOptions, 'httpDropped'>;
}

export class Servers implements Component {
  readonly name = 'admin servers';
  private readonly servers: Server[] = [];
  private bound: ServerAddresses | null = null;

  constructor(private readonly o: ServersOptions) {}

  /** Where the servers listen (ports resolved when configured as 0); set once started. */
  get addresses(): ServerAddresses {
    if (this.bound === null) throw new Error('the servers are not listening yet');
    return this.bound;
  }

  async start(): Promise<void> {
    const { config, logs, readiness } = this.o;
    const drops = new DropCounter(logs.forTarget('admin'));
    const metrics = new Metrics({ ...this.o.metrics, httpDropped: () => drops.counts });
    const admin = createAdminServer({ ...this.o.admin, logs });
    const stats = createStatsServer(metrics);
    // The entry may have bound the readiness address already (admin/early-readiness.ts): take that server over.
    const early = await takeEarlyReadiness(config.readinessAddr, readinessHandler(() => readiness.pending()));
    const ready = early ?? createReadinessServer(readiness);
    // Connection caps: a flood of slow clients on a port open to the network cannot take the daemon's descriptors.
    for (const [server, name] of [[admin, 'admin'], [stats, 'stats'], [ready, 'readiness']] as const) {
      capConnections(server, name, (n) => drops.drop(n));
    }
    this.servers.push(ready, admin, stats);
    this.bound = {
      readiness: early ? boundAddress(early) : await listen(ready, config.readinessAddr),
      admin: await listen(admin, config.adminAddr),
      stats: await listen(stats, config.statsAddr),
    };
    logs.root.info(
      { admin: formatSocketAddress(this.bound.admin), stats: formatSocketAddress(this.bound.stats), readiness: formatSocketAddress(this.bound.readiness) },
      'admin servers listening',
    );
  }

  /** Stop accepting; open requests get a second to finish (none when immediate). */
  async stop(mode: DrainMode): Promise<void> {
    await Promise.all(this.servers.map((s) => closeServer(s, mode === 'immediate' ? 0 : undefined)));
  }
}
