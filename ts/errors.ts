// The error catalog: every failure that crosses a module boundary carries a stable `code` (what failed) and
// `retryable` (whether trying again, unchanged, can help). Native errors arrive as `Error`s whose message starts
// with `<CODE>: ` (docs/native-api.md); `fromNativeError` turns them into ZtunnelErrors so callers switch on
// `code`, never on message text.

import type { NativeErrorCode } from './native/generated/NativeErrorCode.js';

export interface ErrorKind {
  readonly retryable: boolean;
  readonly description: string;
}

/**
 * The native module's codes (prefixes of its error messages), one entry for each code of the Rust enum
 * `ErrorCode` (native/mesh/src/error_code.rs), from which `NativeErrorCode` is generated: a code added there
 * without a description here does not compile.
 */
const NATIVE_ERRORS = {
  INVALID_STATE: { retryable: false, description: 'the dataplane rejected a state delta; the previous state stays' },
  CERT_MISMATCH: { retryable: false, description: 'the certificate does not match the pending key; create a new CSR' },
  BIND_FAILED: { retryable: true, description: 'a listener could not bind (address in use or not local)' },
  CA_ERROR: { retryable: true, description: 'the local CA could not load or create its root' },
  CSR_INVALID: { retryable: false, description: 'the CSR signature or identity did not verify' },
  INVALID_CONFIG: { retryable: false, description: 'the dataplane rejected its DataplaneConfig' },
  INVALID_SPEC: { retryable: false, description: 'a request to the dataplane was malformed (a workload spec, a preview, a log level)' },
  INVALID_IDENTITY: { retryable: false, description: 'not a SPIFFE identity the dataplane accepts' },
  INVALID_CRL: { retryable: false, description: 'the certificate revocation lists do not parse; the lists in force stay' },
  CSR_FAILED: { retryable: true, description: 'key or CSR generation failed' },
  CERT_INVALID: { retryable: false, description: 'the certificate chain or roots do not parse' },
  NO_CERTIFICATE: { retryable: true, description: 'no certificate installed for the identity yet' },
  TLS_CONFIG: { retryable: false, description: 'a TLS configuration could not be built from the certificate' },
  RUNTIME: { retryable: false, description: 'the dataplane runtime failed' },
  PROFILE: { retryable: true, description: 'a profile could not be taken (one is running, it was cancelled, or sampling is off)' },
} as const satisfies Record<NativeErrorCode, ErrorKind>;

export const ERROR_CATALOG = {
  ...NATIVE_ERRORS,
  // From the TypeScript layer.
  NATIVE_UNAVAILABLE: { retryable: false, description: 'no native binary for this platform' },
  NOT_RUNNING: { retryable: true, description: 'the dataplane is not running yet (the local config is loading)' },
  NATIVE_ERROR: { retryable: false, description: 'the native module failed without a known code' },
  CONFIG_INVALID: { retryable: false, description: 'an environment variable or flag is invalid' },
  LOCAL_CONFIG_INVALID: { retryable: false, description: 'the local config file is unreadable or invalid' },
  CA_UNAVAILABLE: { retryable: true, description: 'the certificate authority could not sign' },
} as const satisfies Record<string, ErrorKind>;

export type ErrorCode = keyof typeof ERROR_CATALOG;

export class ZtunnelError extends Error {
  readonly code: ErrorCode;
  readonly retryable: boolean;

  constructor(code: ErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'ZtunnelError';
    this.code = code;
    this.retryable = ERROR_CATALOG[code].retryable;
  }
}

/** An invalid environment variable or CLI flag; the message names the variable/flag and the problem. */
export class ConfigError extends ZtunnelError {
  constructor(message: string, options?: { cause?: unknown }) {
    super('CONFIG_INVALID', message, options);
    this.name = 'ConfigError';
  }
}

/** An invalid local config document; the message names the file, the path in the document and the problem. */
export class LocalConfigError extends ZtunnelError {
  constructor(message: string, options?: { cause?: unknown }) {
    super('LOCAL_CONFIG_INVALID', message, options);
    this.name = 'LocalConfigError';
  }
}

function isNativeCode(code: string): code is NativeErrorCode {
  return Object.hasOwn(NATIVE_ERRORS, code);
}

/**
 * Maps an error thrown by the native module to a ZtunnelError. The `<CODE>: ` prefix is stripped from the message
 * (the code is on `.code`); unknown messages become NATIVE_ERROR with the text unchanged.
 */
export function fromNativeError(err: unknown): ZtunnelError {
  if (err instanceof ZtunnelError) return err;
  const message = err instanceof Error ? err.message : String(err);
  const code = /^([A-Z][A-Z_]*):/.exec(message)?.[1];
  if (code !== undefined && isNativeCode(code)) {
    return new ZtunnelError(code, message.slice(code.length + 1).trim(), { cause: err });
  }
  return new ZtunnelError('NATIVE_ERROR', message, { cause: err });
}

/** True for errors that are a user's configuration mistake (the CLI exits 2 for these). */
export function isConfigError(err: unknown): err is ZtunnelError {
  return err instanceof ZtunnelError && (err.code === 'CONFIG_INVALID' || err.code === 'LOCAL_CONFIG_INVALID');
}
