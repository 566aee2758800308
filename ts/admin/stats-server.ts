// The stats server (STATS_ADDR, default :15020): Prometheus scrapes `/metrics` or `/stats/prometheus`.
import type { Server } from 'node:http';
import type { Metrics } from './metrics.js';
import { createHttpServer, pathOf, reply } from './http.js';

export function createStatsServer(metrics: Metrics): Server {
  return createHttpServer((req, res) => {
    const path = pathOf(req);
    if (path !== '/metrics' && path !== '/stats/prometheus') return reply(res, 404, 'not found\n');
    if (req.method !== 'GET' && req.method !== 'HEAD') return reply(res, 405, 'method not allowed\n');
    metrics.render(req.headers.accept).then(
      ({ contentType, body }) => reply(res, 200, body, contentType),
      (err: unknown) => reply(res, 500, `failed to render metrics: ${err instanceof Error ? err.message : String(err)}\n`),
    );
  });
}
