// AUTH_TOKEN for istiod's xDS and CA calls. Its own module so that the daemon can hold one without loading gRPC
// (local mode loads the gRPC clients only when XDS_ADDRESS or CA_ADDRESS is set).
import { existsSync, readFileSync } from 'node:fs';
import { DEFAULT_AUTH_TOKEN_PATH } from '../config/defaults.js';

/** AUTH_TOKEN: a file (read on every call, so a rotated token is used on the next request) or the literal. */
export class TokenSource {
  constructor(private readonly setting: string | null) {}

  /** The token, or null when none is configured. Throws when the token file exists but is empty. */
  read(): string | null {
    const path = this.setting ?? DEFAULT_AUTH_TOKEN_PATH;
    if (existsSync(path)) {
      const token = readFileSync(path, 'utf8').trim();
      if (token === '') throw new Error(`the token file ${path} is empty`);
      return token;
    }
    // A setting that is not an existing file is the token itself; the default path is simply absent.
    return this.setting;
  }
}
