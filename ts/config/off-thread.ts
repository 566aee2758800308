// The daemon's configuration parsed in a worker thread (config-worker.ts), with exactly `loadConfig`'s answers: the
// same frozen Config, the same ConfigError messages.
//
// Why a worker: the schema is zod (with its locales) and the config's field schemas, about 4 MiB of JavaScript heap
// and 5-6 MiB of the process's anonymous memory once loaded. A module never unloads, and the daemon reads its
// configuration once, at start; in a worker that ends, the memory goes with the worker's heap. Measured in an idle
// daemon (bench/idle-rss.mjs): see bench/results/README.md ("The daemon's private memory").
//
// Nothing on this side imports the schema: this module's imports are the error types and the Config's freezing.
import { Worker } from 'node:worker_threads';
import { ConfigError } from '../errors.js';
import { deepFreeze, type Config } from './config.js';
import type { ConfigWorkerData, FromConfigWorker } from './config-worker.js';

/** `loadConfig` of env and flags, run in a worker thread. Rejects with a ConfigError as `loadConfig` throws it. */
export function loadConfigOffThread(input: {
  env: Readonly<Record<string, string | undefined>>;
  args?: readonly string[];
  allArgs?: readonly string[];
}): Promise<Config> {
  const args = [...(input.args ?? [])];
  const data: ConfigWorkerData = { env: { ...input.env }, args, allArgs: [...(input.allArgs ?? args)] };
  return new Promise<Config>((resolve, reject) => {
    let answer: FromConfigWorker | null = null;
    const worker = new Worker(new URL('./config-worker.js', import.meta.url), { workerData: data });
    worker.once('message', (m: FromConfigWorker) => {
      answer = m;
    });
    worker.once('error', (err) => reject(err));
    // Settled once the worker has ended, so that its memory is being given back when the daemon goes on.
    worker.once('exit', (code) => {
      if (answer === null) return reject(new Error(`the config worker ended (exit code ${code}) without an answer`));
      if (answer.op === 'loaded') return resolve(deepFreeze(answer.config));
      reject(answer.op === 'invalid' ? new ConfigError(answer.message) : new Error(answer.message));
    });
  });
}
