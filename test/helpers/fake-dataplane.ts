// A stand-in for the native Dataplane (the daemon's DataplanePort), for running the daemon's lifecycle in process
// without binding sockets: the state calls go to a REAL native dataplane (the mesh lives there: a stand-in for it
// would test nothing), everything that binds, dials or signs answers like an idle dataplane. Every call is recorded
// in `log` as [op, arg]; calls that matter to a test can be replaced through `overrides`.
import type { DataplanePort } from '../../dist/lifecycle/dataplane.js';
import type { AuthzPreviewRequest, Dataplane, LocalWorkloadSpec, StateDelta } from '../../dist/native/index.js';
import { openNativeDataplane } from './native-dataplane.js';

/** One recorded call: [op, arg] (the op alone for `shutdown`). Suites push their own entries too. */
export type FakeDataplaneLogEntry = [op: string, arg?: unknown];

/**
 * The stand-in, typed as the daemon's DataplanePort (what `ProxyDeps.openDataplane` returns) plus what the tests read.
 * Not all of it is there: the methods of shared and dedicated mode and of profiling (startInpod, startDedicated,
 * startSelfInbound, inpodState, cpuProfile, cancelCpuProfile, heapProfiling, heapProfile) are absent (a test that
 * reaches one fails on it), and metrics() and authorize() answer partial values (what the local-mode tests read).
 */
export interface FakeDataplane extends DataplanePort {
  /** Every call that matters, in order. */
  log: FakeDataplaneLogEntry[];
  /** The real native dataplane holding the state. */
  real: Dataplane;
  applyStateBatches: Dataplane['applyStateBatches'];
}

/** A function type with the same parameters and any result (an override may answer a partial value). */
type LooseResult<F> = F extends (...args: infer A) => unknown ? (...args: A) => unknown : F;

/**
 * What `fakeDataplane` takes: replacements of the fake's members (each method with the port's parameters; its
 * result is the test's business) and any members of the test's own (`this` in a method is the whole fake).
 */
export type FakeDataplaneOverrides = { [K in keyof FakeDataplane]?: LooseResult<FakeDataplane[K]> } & Record<string, unknown>;

export interface FakeDataplaneOptions {
  /** NODE_NAME of the real dataplane. Default 'node-a'. */
  nodeName?: string;
}

export function fakeDataplane(): FakeDataplane;
export function fakeDataplane<O extends FakeDataplaneOverrides>(
  overrides: O & ThisType<FakeDataplane & O>,
  options?: FakeDataplaneOptions,
): FakeDataplane & O;
export function fakeDataplane(overrides: FakeDataplaneOverrides = {}, { nodeName = 'node-a' }: FakeDataplaneOptions = {}): FakeDataplane {
  const log: FakeDataplaneLogEntry[] = [];
  const real = openNativeDataplane({ nodeName });
  const fake = {
    log,
    real,
    applyState: (d: StateDelta) => (log.push(['applyState', d]), real.applyState(d)),
    applyStateBatches: async (chunks: Uint8Array[]) => (log.push(['applyStateBatches', chunks]), real.applyStateBatches(chunks)),
    applyLocal: async (ticket: number, chunks: Uint8Array[]) => (log.push(['applyLocal', { ticket, chunks }]), real.applyLocal(ticket, chunks)),
    applyAddresses: async (resources: readonly Uint8Array[], removed: string[]) => (log.push(['applyAddresses', { resources: resources.length, removed }]), real.applyAddresses(resources, removed)),
    meshDump: () => real.meshDump(),
    outliers: () => real.outliers(),
    localDump: () => real.localDump(),
    // The fake binds no listener, so the real dataplane serves no local workload: an empty map.
    localWorkloadState: () => real.localWorkloadState(),
    createCsr: (id: string) => (log.push(['createCsr', id]), 'CSR'),
    installCertificate: (id: string) => void log.push(['installCertificate', id]),
    setCrls: (pem: string) => (log.push(['setCrls', pem.length]), (pem.match(/BEGIN X509 CRL/g) ?? []).length),
    forgetIdentity: (id: string) => (log.push(['forgetIdentity', id]), false),
    // Certificates on demand: nothing is ever asked (the empty answer ends the daemon's loop).
    nextCertificateRequests: async (): Promise<string[]> => [],
    addLocalWorkload: async (spec: LocalWorkloadSpec) => (log.push(['addLocalWorkload', spec]), { uid: spec.uid, hboneAddr: spec.hboneAddr, socksAddr: spec.socksAddr }),
    removeLocalWorkload: async (uid: string) => void log.push(['removeLocalWorkload', uid]),
    metrics: () => ({ connections: [], socketsOpen: { source: 0, destination: 0 } }),
    authorize: () => ({}),
    // Judges nothing live (no listener), but the candidates are read and refused as the daemon's would be.
    previewAuthz: (r: AuthzPreviewRequest) => real.previewAuthz(r),
    drainEvents: () => [],
    exportOtlp: () => undefined,
    takeOtlp: () => ({ body: null, count: 0, dropped: 0 }),
    setEventLevels: () => undefined,
    // Hand-over: no predecessor, and no successor ever comes.
    handoverTake: async (path: string) => (log.push(['handoverTake', path]), { role: 'take', found: false, connections: 0, kept: 0, durationMs: 0, pauseMs: 0, peerPid: 0, peerVersion: 0, waves: 0 }),
    handoverListen: (path: string, replace: boolean) => void log.push(['handoverListen', { path, replace }]),
    nextHandover: () => new Promise<never>(() => {}),
    drain: async () => true,
    shutdown: () => {
      log.push(['shutdown']);
      real.shutdown();
    },
    ...overrides,
  };
  // The stand-in as the port the daemon takes (see FakeDataplane: what it lacks is never reached in local mode).
  return fake as FakeDataplane;
}
