// A small client of the Kubernetes API for the e2e node's runtime and the scenarios: JSON requests and watches over
// HTTPS with a client certificate, nothing cached. Objects are typed only as far as the runtime reads them.
import { readFileSync } from 'node:fs';
import { request, type RequestOptions } from 'node:https';
import type { KeyPair } from './pki.js';

export interface ObjectMeta {
  name: string;
  namespace?: string;
  uid?: string;
  resourceVersion?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  deletionTimestamp?: string;
  deletionGracePeriodSeconds?: number;
  ownerReferences?: { kind: string; name: string }[];
  generateName?: string;
}

export interface KubeObject {
  apiVersion?: string;
  kind?: string;
  metadata: ObjectMeta;
  [key: string]: unknown;
}

/** An answer that is not 2xx: the status and the API's message. */
export class KubeError extends Error {
  readonly status: number;
  readonly reason: string;
  constructor(status: number, method: string, path: string, body: string) {
    let message = body;
    let reason = '';
    try {
      const s = JSON.parse(body) as { message?: string; reason?: string };
      message = s.message ?? body;
      reason = s.reason ?? '';
    } catch {
      // not a Status
    }
    super(`${method} ${path}: ${status} ${message}`);
    this.status = status;
    this.reason = reason;
  }
}

export interface WatchEvent<T extends KubeObject = KubeObject> {
  type: 'ADDED' | 'MODIFIED' | 'DELETED' | 'BOOKMARK' | 'ERROR';
  object: T;
}

export class Kube {
  private readonly base: URL;
  private readonly tls: Pick<RequestOptions, 'ca' | 'cert' | 'key'>;

  constructor(server: string, ca: string, user: KeyPair) {
    this.base = new URL(server);
    this.tls = { ca: readFileSync(ca), cert: readFileSync(user.cert), key: readFileSync(user.key) };
  }

  /** One request; resolves the parsed JSON body (or the text when it is not JSON). 4xx/5xx reject with KubeError. */
  request<T = unknown>(method: string, path: string, body?: unknown, contentType = 'application/json', timeoutMs = 30_000): Promise<T> {
    return new Promise((resolve, reject) => {
      const payload = body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body);
      const req = request({
        ...this.tls,
        host: this.base.hostname,
        port: this.base.port,
        method,
        path,
        timeout: timeoutMs,
        headers: { accept: 'application/json', ...(payload !== undefined ? { 'content-type': contentType, 'content-length': Buffer.byteLength(payload) } : {}) },
      }, (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString('utf8');
          if ((res.statusCode ?? 0) >= 300) return reject(new KubeError(res.statusCode ?? 0, method, path, text));
          try {
            resolve(JSON.parse(text) as T);
          } catch {
            resolve(text as T);
          }
        });
        res.on('error', reject);
      });
      req.on('timeout', () => req.destroy(new Error(`${method} ${path}: no answer within ${timeoutMs} ms`)));
      req.on('error', reject);
      req.end(payload);
    });
  }

  get<T extends KubeObject = KubeObject>(path: string): Promise<T> {
    return this.request<T>('GET', path);
  }

  /** The object at `path`, or null when it does not exist. */
  async getOrNull<T extends KubeObject = KubeObject>(path: string): Promise<T | null> {
    try {
      return await this.get<T>(path);
    } catch (err) {
      if (err instanceof KubeError && err.status === 404) return null;
      throw err;
    }
  }

  async list<T extends KubeObject = KubeObject>(path: string): Promise<{ items: T[]; resourceVersion: string }> {
    const l = await this.request<{ items: T[]; metadata: { resourceVersion: string } }>('GET', path);
    return { items: l.items, resourceVersion: l.metadata.resourceVersion };
  }

  create<T extends KubeObject = KubeObject>(path: string, obj: unknown): Promise<T> {
    return this.request<T>('POST', path, obj);
  }

  /** A strategic merge patch (or a merge patch for custom resources and status with `merge`). */
  patch<T extends KubeObject = KubeObject>(path: string, patch: unknown, type: 'strategic' | 'merge' = 'strategic'): Promise<T> {
    const ct = type === 'strategic' ? 'application/strategic-merge-patch+json' : 'application/merge-patch+json';
    return this.request<T>('PATCH', path, patch, ct);
  }

  delete(path: string, options: Record<string, unknown> = {}): Promise<unknown> {
    return this.request('DELETE', path, { kind: 'DeleteOptions', apiVersion: 'v1', ...options });
  }

  /**
   * Watches `path` (a list path, with its own query) from its current state: `onEvent` gets an ADDED for what exists,
   * then every change; reconnects after a dropped connection (from the last resourceVersion seen, or from a fresh list
   * when that is too old). Returns a stop function.
   */
  watch<T extends KubeObject = KubeObject>(path: string, onEvent: (e: WatchEvent<T>) => void, onError: (err: Error) => void = () => {}): () => void {
    let stopped = false;
    let current: { destroy(): void } | null = null;
    let rv = '';
    const sep = path.includes('?') ? '&' : '?';
    const relist = async (): Promise<void> => {
      const l = await this.list<T>(path);
      for (const object of l.items) onEvent({ type: 'ADDED', object });
      rv = l.resourceVersion;
    };
    const connect = (): void => {
      if (stopped) return;
      let buffered = '';
      let gone = false;
      const req = request({
        ...this.tls,
        host: this.base.hostname,
        port: this.base.port,
        method: 'GET',
        path: `${path}${sep}watch=1&allowWatchBookmarks=true&resourceVersion=${rv}`,
        headers: { accept: 'application/json' },
      }, (res) => {
        if (res.statusCode !== 200) {
          res.resume();
          return again(new Error(`watch ${path}: ${res.statusCode}`), false);
        }
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => {
          buffered += chunk;
          let nl;
          while ((nl = buffered.indexOf('\n')) >= 0) {
            const line = buffered.slice(0, nl);
            buffered = buffered.slice(nl + 1);
            if (line.trim() === '') continue;
            const e = JSON.parse(line) as WatchEvent<T>;
            if (e.type === 'ERROR') {
              // 410 Gone: the resourceVersion is too old; list again.
              gone = true;
              continue;
            }
            if (e.object.metadata?.resourceVersion) rv = e.object.metadata.resourceVersion;
            if (e.type !== 'BOOKMARK') onEvent(e);
          }
        });
        res.on('end', () => again(null, gone));
        res.on('error', (err) => again(err, gone));
      });
      req.on('error', (err) => again(err, false));
      req.end();
      current = req;
    };
    let retrying = false;
    const again = (err: Error | null, relistFirst: boolean): void => {
      if (stopped || retrying) return;
      retrying = true;
      if (err) onError(err);
      setTimeout(() => {
        retrying = false;
        if (stopped) return;
        (relistFirst ? relist() : Promise.resolve()).then(connect, (e: Error) => again(e, true));
      }, err ? 500 : 0);
    };
    relist().then(connect, (e: Error) => again(e, true));
    return () => {
      stopped = true;
      current?.destroy();
    };
  }
}

/** The API path of a namespaced (or, without `namespace`, cluster-scoped) core or group resource. */
export function apiPath(resource: string, { group, version = 'v1', namespace, name, sub }: { group?: string; version?: string; namespace?: string; name?: string; sub?: string } = {}): string {
  const root = group ? `/apis/${group}/${version}` : `/api/${version}`;
  return [root, namespace ? `namespaces/${namespace}` : '', resource, name ?? '', sub ?? ''].filter((p) => p !== '').join('/').replace(/\/+/g, '/');
}
