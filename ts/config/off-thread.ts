// The daemon's configuration parsed in a worker thread (config-worker.ts), with exactly `loadConfig`'s answers: the
// same frozen Config, the same ConfigError messages; and, asked for, the first local config load made there too.
//
// Why a worker: the schema is zod (with its locales) and the config's field schemas, about 4 MiB of JavaScript heap
// and 5-6 MiB of the process's anonymous memory once loaded. A module never unloads, and the daemon reads its
// configuration once, at start; in a worker that ends, the memory goes with the worker's heap. Measured in an idle
// daemon (bench/idle-rss.mjs): see bench/results/README.md ("Issue 31: the daemon's private memory").
//
// Nothing on this side imports the schema: this module's imports are the error types and the Config's freezing.
import { ConfigError } from '../errors.js';
import { deepFreeze, type Config } from './config.js';
import type { ConfigWorkerData, FromConfigWorker } from './config-worker.js';
import type { FromWorker } from './local-prepare.js';
import type { FileState } from './watch.js';
import { workerAnswer } from '../worker-answer.js';

export interface ConfigInput {
  env: Readonly<Record<string, string | undefined>>;
  args?: readonly string[];
  allArgs?: readonly string[];
}

/** The daemon's first local config load, made with its config's parse. */
export interface FirstLocalLoad {
  /** The load's answer (for `LocalConfigLoader.open`). */
  answer: FromWorker;
  /** The file's state before it was read (the reload watch's starting state); null for inline LOCAL_XDS. */
  file: FileState | null;
}

/** A parsed config, and the first local config load, if asked for and there is a local config. */
export interface Startup {
  config: Config;
  firstLocalLoad: FirstLocalLoad | null;
}

/** `loadConfig` of env and flags, run in a worker thread. Rejects with a ConfigError as `loadConfig` throws it. */
export async function loadConfigOffThread(input: ConfigInput): Promise<Config> {
  return (await parseOffThread(input, false)).config;
}

/**
 * The daemon's start: its config parsed, and the first load of the local config it names made, in one worker
 * thread (the schema loads once). Rejects as `loadConfigOffThread`; a refused local config is not a rejection here
 * but the first load's answer (the daemon reports it as it reports a refused load).
 */
export function startupOffThread(input: ConfigInput): Promise<Startup> {
  return parseOffThread(input, true);
}

async function parseOffThread(input: ConfigInput, firstLocalLoad: boolean): Promise<Startup> {
  const args = [...(input.args ?? [])];
  const data: ConfigWorkerData = { env: { ...input.env }, args, allArgs: [...(input.allArgs ?? args)], firstLocalLoad };
  const answer = await workerAnswer<FromConfigWorker>(new URL('./config-worker.js', import.meta.url), data, 'config');
  if (answer.op === 'invalid') throw new ConfigError(answer.message);
  if (answer.op === 'failed') throw new Error(answer.message);
  const first = answer.local === null ? null : { answer: answer.local, file: answer.localFile };
  return { config: deepFreeze(answer.config), firstLocalLoad: first };
}
