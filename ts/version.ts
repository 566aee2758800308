// Build information for `ztunnel-node version` and config_dump's `version` (ztunnel's BuildInfo keys).
import { readFileSync } from 'node:fs';
import type { NativeVersion } from './native/types.js';

export interface BuildInfo {
  version: string;
  gitRevision: string;
  rustVersion: string;
  buildProfile: string;
  buildStatus: string;
  istioVersion: string;
  cryptoProvider: string;
}

let cached: string | undefined;

/** The package version. package.json sits one level above both ts/ and dist/. */
export function packageVersion(): string {
  if (cached === undefined) {
    try {
      const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version?: string };
      cached = pkg.version ?? 'unknown';
    } catch {
      cached = 'unknown';
    }
  }
  return cached;
}

export function buildInfo(native: NativeVersion | null, istioVersion: string | null): BuildInfo {
  return {
    version: packageVersion(),
    // Not stamped at build time yet.
    gitRevision: 'unknown',
    rustVersion: native?.rustVersion ?? 'unknown',
    buildProfile: native?.buildProfile ?? 'unknown',
    buildStatus: 'unknown',
    istioVersion: istioVersion ?? 'unknown',
    cryptoProvider: native?.cryptoProvider ?? 'unknown',
  };
}
