// A stand-in for the native Dataplane (the daemon's DataplanePort), for running the daemon's lifecycle in process
// without binding sockets: the state calls go to a REAL native dataplane (the mesh lives there: a stand-in for it
// would test nothing), everything that binds, dials or signs answers like an idle dataplane. Every call is recorded
// in `log` as [op, arg]; calls that matter to a test can be replaced through `overrides`.
import { openNativeDataplane } from './native-dataplane.js';

export function fakeDataplane(overrides = {}, { nodeName = 'node-a' } = {}) {
  const log = [];
  const real = openNativeDataplane({ nodeName });
  const fake = {
    log,
    real,
    applyState: (d) => (log.push(['applyState', d]), real.applyState(d)),
    applyStateBatches: async (chunks) => (log.push(['applyStateBatches', chunks]), real.applyStateBatches(chunks)),
    applyLocal: async (ticket, chunks) => (log.push(['applyLocal', { ticket, chunks }]), real.applyLocal(ticket, chunks)),
    applyAddresses: async (resources, removed) => (log.push(['applyAddresses', { resources: resources.length, removed }]), real.applyAddresses(resources, removed)),
    meshDump: () => real.meshDump(),
    outliers: () => real.outliers(),
    localDump: () => real.localDump(),
    // The fake binds no listener, so the real dataplane serves no local workload: an empty map.
    localWorkloadState: () => real.localWorkloadState(),
    createCsr: (id) => (log.push(['createCsr', id]), 'CSR'),
    installCertificate: (id) => void log.push(['installCertificate', id]),
    setCrls: (pem) => (log.push(['setCrls', pem.length]), (pem.match(/BEGIN X509 CRL/g) ?? []).length),
    forgetIdentity: (id) => (log.push(['forgetIdentity', id]), false),
    // Certificates on demand: nothing is ever asked (the empty answer ends the daemon's loop).
    nextCertificateRequests: async () => [],
    addLocalWorkload: async (spec) => (log.push(['addLocalWorkload', spec]), { uid: spec.uid, hboneAddr: spec.hboneAddr, socksAddr: spec.socksAddr }),
    removeLocalWorkload: async (uid) => void log.push(['removeLocalWorkload', uid]),
    metrics: () => ({ connections: [], socketsOpen: { source: 0, destination: 0 } }),
    authorize: () => ({}),
    // Judges nothing live (no listener), but the candidates are read and refused as the daemon's would be.
    previewAuthz: (r) => real.previewAuthz(r),
    drainEvents: () => [],
    exportOtlp: () => undefined,
    takeOtlp: () => ({ body: null, count: 0, dropped: 0 }),
    setEventLevels: () => undefined,
    // Hand-over: no predecessor, and no successor ever comes.
    handoverTake: async (path) => (log.push(['handoverTake', path]), { role: 'take', found: false, connections: 0, kept: 0, durationMs: 0, pauseMs: 0, peerPid: 0, peerVersion: 0, waves: 0 }),
    handoverListen: (path, replace) => void log.push(['handoverListen', { path, replace }]),
    nextHandover: () => new Promise(() => {}),
    drain: async () => true,
    shutdown: () => {
      log.push(['shutdown']);
      real.shutdown();
    },
    ...overrides,
  };
  return fake;
}
