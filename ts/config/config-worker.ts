// The daemon's configuration, parsed in a worker thread (started by off-thread.ts): the schema (zod and the config's
// field schemas, ~4 MiB of JavaScript heap) loads here and goes with the worker, so the daemon's main thread, which
// runs for weeks, never holds it.
//
// Protocol: started with `ConfigWorkerData`; posts one `FromConfigWorker` and ends.
import { parentPort, workerData } from 'node:worker_threads';
import { ConfigError } from '../errors.js';
import type { Config } from './config.js';
import { loadConfig } from './index.js';

/** What the worker is started with: `loadConfig`'s input, less what cannot cross a thread (the file callbacks). */
export interface ConfigWorkerData {
  env: Record<string, string | undefined>;
  args: string[];
  allArgs: string[];
}

export type FromConfigWorker =
  | { op: 'loaded'; config: Config }
  /** A ConfigError: the message names every bad variable or flag. */
  | { op: 'invalid'; message: string }
  | { op: 'failed'; message: string };

/** One parse, as a message; never throws. */
export function parseConfigMessage(data: ConfigWorkerData): FromConfigWorker {
  try {
    return { op: 'loaded', config: loadConfig(data) };
  } catch (err) {
    if (err instanceof ConfigError) return { op: 'invalid', message: err.message };
    return { op: 'failed', message: err instanceof Error ? err.message : String(err) };
  }
}

if (parentPort !== null) parentPort.postMessage(parseConfigMessage(workerData as ConfigWorkerData));
