// The readiness server (READINESS_ADDR, default :15021): what the kubelet probes.
import { createServer, type Server } from 'node:http';
import { renderReadiness, type Readiness } from '../lifecycle/readiness.js';
import { pathOf, reply, serverOptions } from './http.js';

export function createReadinessServer(readiness: Readiness): Server {
  return createServer(serverOptions(), (req, res) => {
    if (pathOf(req) !== '/healthz/ready') return reply(res, 404, 'not found\n');
    if (req.method !== 'GET') return reply(res, 405, 'method not allowed\n');
    const { status, body } = renderReadiness(readiness.pending());
    reply(res, status, body);
  });
}
