// A stand-in for the native Dataplane (the daemon's DataplanePort), for running the daemon's lifecycle in process
// without the native module. Calls that matter to a test can be replaced through `overrides`; the rest answer
// like an idle dataplane.
export function fakeDataplane(overrides = {}) {
  return {
    // What the napi boundary costs: the delta crosses as one JSON string.
    applyState: (d) => void JSON.stringify(d),
    createCsr: () => 'CSR',
    installCertificate: () => undefined,
    forgetIdentity: () => false,
    // Certificates on demand: nothing is ever asked (the empty answer ends the daemon's loop).
    nextCertificateRequests: async () => [],
    addLocalWorkload: async (spec) => ({ hboneAddr: spec.hboneAddr, socksAddr: spec.socksAddr }),
    removeLocalWorkload: async () => undefined,
    metrics: () => ({ connections: [], socketsOpen: { source: 0, destination: 0 } }),
    authorize: () => ({}),
    drainEvents: () => [],
    setEventLevels: () => undefined,
    drain: async () => true,
    shutdown: () => undefined,
    ...overrides,
  };
}
