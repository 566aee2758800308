// The daemon's configuration, parsed in a worker thread (started by off-thread.ts): the schema (zod and the config's
// field schemas, ~4 MiB of JavaScript heap) loads here and goes with the worker, so the daemon's main thread, which
// runs for weeks, never holds it. With the schema loaded, the same worker then makes the daemon's first local config
// load (local-prepare.ts), which would otherwise start a worker of its own and load the schema again: the daemon is
// ready that much sooner.
//
// Protocol: started with `ConfigWorkerData`; posts one `FromConfigWorker` (transferring the first load's buffers)
// and ends.
import { parentPort, workerData } from 'node:worker_threads';
import { ConfigError } from '../errors.js';
import type { Config } from './config.js';
import { loadConfig } from './index.js';
import type { FromWorker } from './local-prepare.js';
import { fileState, type FileState } from './watch.js';

/** What the worker is started with: `loadConfig`'s input, less what cannot cross a thread (the file callbacks). */
export interface ConfigWorkerData {
  env: Record<string, string | undefined>;
  args: string[];
  allArgs: string[];
  /** Also make the first load of the local config the Config names, if it names one. */
  firstLocalLoad: boolean;
}

export type FromConfigWorker =
  /**
   * `local`: the first local config load's answer (null: none asked for, or no local config); `localFile`: the
   * file's state taken before it was read (the watch's starting state; null for inline LOCAL_XDS).
   */
  | { op: 'loaded'; config: Config; local: FromWorker | null; localFile: FileState | null }
  /** A ConfigError: the message names every bad variable or flag. */
  | { op: 'invalid'; message: string }
  | { op: 'failed'; message: string };

/** One parse (and first local load), as a message and the buffers it transfers; never rejects. */
export async function parseConfigMessage(data: ConfigWorkerData): Promise<{ message: FromConfigWorker; transfer: ArrayBuffer[] }> {
  let config: Config;
  try {
    config = loadConfig(data);
  } catch (err) {
    if (err instanceof ConfigError) return { message: { op: 'invalid', message: err.message }, transfer: [] };
    return { message: { op: 'failed', message: err instanceof Error ? err.message : String(err) }, transfer: [] };
  }
  if (!data.firstLocalLoad || (config.localXdsPath === null && config.localXds === null)) {
    return { message: { op: 'loaded', config, local: null, localFile: null }, transfer: [] };
  }
  // Before the read: a change made after it then differs from this state, and the daemon's watch reloads it.
  const localFile = config.localXdsPath === null ? null : await fileState(config.localXdsPath);
  // As local-loader.ts starts a daemon's first load: not a reload.
  const { prepareLoad } = await import('./local-prepare.js');
  const local = await prepareLoad({ localXdsPath: config.localXdsPath, localXds: config.localXds, reload: false });
  return { message: { op: 'loaded', config, local: local.message, localFile }, transfer: local.transfer };
}

if (parentPort !== null) {
  const port = parentPort;
  parseConfigMessage(workerData as ConfigWorkerData).then(
    ({ message, transfer }) => port.postMessage(message, transfer),
    (err: unknown) => port.postMessage({ op: 'failed', message: err instanceof Error ? err.message : String(err) } satisfies FromConfigWorker),
  );
}
