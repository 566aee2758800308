// The package's programmatic API (package.json "main"): what tests, benchmarks and embedders call.
export { loadConfig, configForDump, type Config, type ConfigInput } from './config/index.js';
export { loadLocalConfig, parseLocalConfig, type LocalConfig } from './config/local.js';
export { runProxy, type ProxyHandle, type ProxyDeps, type ProxyOptions } from './lifecycle/proxy.js';
export { dataplaneConfig } from './lifecycle/dataplane.js';
export { Readiness, renderReadiness } from './lifecycle/readiness.js';
export { Drain, type DrainMode } from './lifecycle/drain.js';
export { createLogs, type Logs } from './log/logger.js';
export { StateStore } from './state/store.js';
export { CertificateManager } from './ca/manager.js';
export { LocalCertificateAuthority, type CertificateAuthority, type SignedCertificate } from './ca/authority.js';
export { Metrics } from './admin/metrics.js';
export { socks5Connect } from './cli/socks5-client.js';
export { parsePrometheusText, sumSamples } from './cli/prom-text.js';
export { Dataplane, LocalCa, openDataplane, nativeVersion, platformTag } from './native/index.js';
export * from './native/types.js';
export * from './errors.js';
