// Certificate revocation lists (CRL_PATH; Istio's chart mounts the `istio-ca-crl` ConfigMap there when
// `peerCaCrl.enabled`): read here and handed to the dataplane, which checks every HBONE peer against them, both ways.
//
// - At start: an unreadable file, or one the dataplane cannot parse, stops the daemon with the file and the problem
//   (revocation the operator asked for must not be silently off). An absent file means "no lists yet" (the ConfigMap
//   may not exist yet): a warning, and the file is watched for.
// - Afterwards: the file is polled (config/watch.ts: ConfigMap updates replace it by rename) and each settled change
//   is read and handed over whole; a bad update, or the file disappearing, is logged and the lists in force stay.
import { readFile } from 'node:fs/promises';
import type { Logger } from 'pino';
import { ConfigError } from '../errors.js';
import { watchLocalConfig, type LocalConfigWatch } from '../config/watch.js';

export interface CrlTarget {
  setCrls(pem: string): number;
}

async function read(path: string): Promise<string | null> {
  try {
    return await readFile(path, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw err;
  }
}

/** Loads CRL_PATH into the dataplane and follows it; `stop()` ends the watch. Rejects with a ConfigError at start. */
export async function followCrls(path: string, target: CrlTarget, log: Logger): Promise<LocalConfigWatch> {
  let pem: string | null;
  try {
    pem = await read(path);
  } catch (err) {
    throw new ConfigError(`CRL_PATH ${path}: cannot read it: ${(err as Error).message}`, { cause: err });
  }
  if (pem === null) {
    log.warn({ path }, 'CRL_PATH does not exist (yet): no certificate is treated as revoked until it does');
  } else {
    try {
      const lists = target.setCrls(pem);
      log.info({ path, lists }, 'certificate revocation lists loaded');
    } catch (err) {
      throw new ConfigError(`CRL_PATH ${path}: ${(err as Error).message}`, { cause: err });
    }
  }
  return watchLocalConfig(
    path,
    async () => {
      const next = await read(path);
      if (next === null) {
        log.warn({ path }, 'CRL_PATH disappeared; the lists in force stay');
        return;
      }
      const lists = target.setCrls(next);
      log.info({ path, lists }, 'certificate revocation lists reloaded');
    },
    (err) => log.error({ path, err: err instanceof Error ? err.message : String(err) }, 'CRL_PATH could not be reloaded; the lists in force stay'),
  );
}
