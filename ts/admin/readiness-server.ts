// The readiness server (READINESS_ADDR, default :15021): what the kubelet probes.
import type { Server } from 'node:http';
import type { Readiness } from '../lifecycle/readiness.js';
import { readinessHandler } from './early-readiness.js';
import { createHttpServer } from './http.js';

export function createReadinessServer(readiness: Readiness): Server {
  return createHttpServer(readinessHandler(() => readiness.pending()));
}
