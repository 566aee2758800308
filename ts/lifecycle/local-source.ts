// The local config (LOCAL_XDS_PATH or LOCAL_XDS) as a mesh source. It starts first, before the servers bind: the
// loader reads and validates the document off the main thread (a 50 MiB file takes a while) and the daemon creates
// nothing until `first` resolves, so a bad file leaves no CA directory, no dataplane and no state to undo. The file is
// watched from the start, so that a change made while the first load runs is not missed; a reload waits until the
// first load has been applied, applies only what changed, and keeps the last good config when the new one is bad.
import type { Logger } from 'pino';
import type { Config } from '../config/index.js';
import { LocalConfigLoader, type LocalLoad } from '../config/local-loader.js';
import type { FirstLocalLoad } from '../config/off-thread.js';
import { watchLocalConfig, type LocalConfigWatch } from '../config/watch.js';
import { LocalConfigError } from '../errors.js';
import { collectAfterBatch } from '../heap.js';
import type { Component } from './daemon.js';
import type { DataplanePort } from './dataplane.js';
import type { Mesh } from './mesh.js';

export class LocalSource implements Component {
  readonly name = 'local config';
  /** The first load (null: no local config); awaited before anything is created. */
  first: Promise<LocalLoad | null> = Promise.resolve(null);
  private loader: LocalConfigLoader | null = null;
  private watch: LocalConfigWatch | null = null;
  private firstApplied!: (ok: boolean) => void;
  private readonly started = new Promise<boolean>((resolve) => (this.firstApplied = resolve));

  constructor(
    private readonly config: Config,
    private readonly log: Logger,
    private readonly mesh: Mesh,
    private readonly signal: AbortSignal,
    /** The first load if it was made with the config's parse: the loader's first load, and the watch's start. */
    private readonly firstLoad: FirstLocalLoad | null = null,
  ) {}

  start(): void {
    const loader = LocalConfigLoader.open(this.config, this.firstLoad?.answer ?? null);
    if (loader === null) return;
    this.loader = loader;
    this.first = loader.load();
    this.first.catch(() => undefined); // awaited by the daemon once the servers listen
    const path = this.config.localXdsPath;
    if (path !== null) {
      this.watch = watchLocalConfig(
        path,
        () => this.reload(),
        (err) => this.log.error({ err: err instanceof Error ? err.message : String(err) }, 'local config reload failed'),
        // A first load made at the process's start read the file before this watch: a change since is reloaded.
        { since: this.firstLoad?.file ?? undefined },
      );
    }
  }

  /** Applies the first load (once the dataplane and certificates are up); the watch's reloads may follow. */
  async applyFirst(): Promise<void> {
    const load = await this.first;
    if (load !== null) {
      const applied = await this.apply(load);
      this.log.info({ source: load.source, ...load.counts, chunks: applied.chunks, applyMs: applied.applyMs }, 'local config applied');
    }
    this.firstApplied(true);
    // Inline LOCAL_XDS never changes: its loader can go.
    if (this.watch === null) {
      this.loader?.close().catch((err: unknown) => this.log.warn({ err: err instanceof Error ? err.message : String(err) }, 'closing the local config loader failed'));
    }
  }

  /**
   * config_dump's `staticConfig`, as ztunnel shows its local config: the last applied local document as the
   * dataplane holds it. Without one (xDS, or before the first applies) the empty document, as ztunnel's admin writes
   * its LocalConfig's default.
   */
  staticConfig(plane: Pick<DataplanePort, 'localDump'> | null): Record<string, unknown> {
    if (plane === null) return { workloads: [], policies: [], services: [] };
    const { workloads, policies, services } = plane.localDump();
    return { workloads, policies, services };
  }

  stop(): Promise<void> | undefined {
    this.firstApplied(false);
    this.watch?.stop();
    return this.loader?.close();
  }

  private async reload(): Promise<void> {
    const loader = this.loader;
    if (loader === null || !(await this.started) || this.signal.aborted) return;
    let next: LocalLoad;
    try {
      next = await loader.load();
    } catch (err) {
      if (this.signal.aborted) return;
      const invalid = err instanceof LocalConfigError;
      this.log.error(
        { err: err instanceof Error ? err.message : String(err) },
        invalid ? 'local config is invalid; keeping the last good config' : 'local config could not be loaded; keeping the last good config',
      );
      return;
    }
    try {
      const applied = await this.apply(next);
      this.log.info({ source: next.source, ...applied }, 'local config reloaded');
    } catch (err) {
      if (this.signal.aborted) return;
      this.log.error({ err: err instanceof Error ? err.message : String(err) }, 'local config rejected by the dataplane; keeping the last good config');
    }
  }

  /** Applies a loaded document (a refusal keeps the last good one: the dataplane changed nothing). */
  private async apply(load: LocalLoad): Promise<{ workloads: number; services: number; policies: number; chunks: number; applyMs: number }> {
    const t0 = performance.now();
    let applied;
    try {
      applied = await this.mesh.applyLocal(load, this.signal);
    } catch (err) {
      this.loader?.discard();
      throw err;
    }
    this.loader?.commit();
    collectAfterBatch(load.counts.workloads + load.counts.services + load.counts.policies);
    return {
      workloads: applied.changedWorkloads,
      services: applied.services,
      policies: applied.policies,
      chunks: load.chunks.length,
      applyMs: Math.round(performance.now() - t0),
    };
  }
}
