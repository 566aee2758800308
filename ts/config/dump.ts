// The `config` section of /config_dump, rendered from the parsed Config. Its own module, apart from the parser
// (index.ts): the daemon renders its dump on the main thread, which never loads the schema (off-thread.ts).
import { existsSync } from 'node:fs';
import { formatLogFilter } from '../log/filter.js';
import { formatSocketAddress } from './address.js';
import type { Config } from './config.js';
import * as D from './defaults.js';
import { formatDurationMs } from './duration.js';
import { readResolverFacts, ztunnelConfigDump } from './ztunnel-dump.js';

/**
 * The `config` key of /config_dump: ztunnel's keys in ztunnel's forms (ztunnel-dump.ts), and under `ztunnelNode` our
 * whole runtime config, camelCase, with durations and addresses rendered. Reads the resolver file, as ztunnel's
 * dump shows what it read from it.
 */
export function configForDump(cfg: Config): Record<string, unknown> {
  const facts = { resolver: readResolverFacts(cfg.dns.resolvConf), exists: existsSync };
  return { ...ztunnelConfigDump(cfg, facts), ztunnelNode: ownConfigForDump(cfg) };
}

/** Our own settings under their own names (config_dump's `config.ztunnelNode`). */
function ownConfigForDump(cfg: Config): Record<string, unknown> {
  return {
    ...cfg,
    // Inline YAML can be long and is already visible under staticConfig; say whether it was given.
    localXds: cfg.localXds === null ? null : '<inline>',
    poolUnusedReleaseTimeout: formatDurationMs(cfg.poolUnusedReleaseTimeoutMs),
    socketConfig: {
      keepaliveTime: formatDurationMs(cfg.socketConfig.keepaliveTimeMs),
      keepaliveInterval: formatDurationMs(cfg.socketConfig.keepaliveIntervalMs),
      keepaliveRetries: cfg.socketConfig.keepaliveRetries,
      keepaliveEnabled: cfg.socketConfig.keepaliveEnabled,
      userTimeoutEnabled: cfg.socketConfig.userTimeoutEnabled,
    },
    connectionTimeout: formatDurationMs(cfg.connectionTimeoutMs),
    missingPolicyGrace: formatDurationMs(cfg.missingPolicyGraceMs),
    selfTerminationDeadline: formatDurationMs(cfg.terminationDeadlineMs),
    secretTtl: formatDurationMs(cfg.secretTtlMs),
    logFilter: formatLogFilter(cfg.logFilter),
    adminAddr: formatSocketAddress(cfg.adminAddr),
    statsAddr: formatSocketAddress(cfg.statsAddr),
    readinessAddr: formatSocketAddress(cfg.readinessAddr),
    dns: { ...cfg.dns, addr: formatSocketAddress(cfg.dns.addr) },
    hbonePort: D.HBONE_PORT,
    // A token must never reach a dump; say whether one is configured.
    authToken: cfg.authToken === null ? null : '<redacted>',
    xdsHeaders: Object.fromEntries(Object.keys(cfg.xdsHeaders).map((k) => [k, '<redacted>'])),
    caHeaders: Object.fromEntries(Object.keys(cfg.caHeaders).map((k) => [k, '<redacted>'])),
  };
}
