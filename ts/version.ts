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

/** Our crypto providers by the name of ztunnel's cargo feature for the same one. */
const CRYPTO_FEATURES: Readonly<Record<string, string>> = {
  'aws-lc-rs': 'tls-aws-lc',
  'aws-lc-rs-fips': 'tls-aws-lc-fips',
  ring: 'tls-ring',
};

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
    // ztunnel's values: the compiler's bare version ("1.95.0", not rustc's whole line), and the crypto provider as
    // its cargo feature names it (ztunnel's `tls-aws-lc`, `tls-ring`).
    rustVersion: /\d+\.\d+\.\d+\S*/.exec(native?.rustVersion ?? '')?.[0] ?? 'unknown',
    buildProfile: native?.buildProfile ?? 'unknown',
    buildStatus: 'unknown',
    istioVersion: istioVersion ?? 'unknown',
    cryptoProvider: CRYPTO_FEATURES[native?.cryptoProvider ?? ''] ?? native?.cryptoProvider ?? 'unknown',
  };
}
