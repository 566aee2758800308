// `ztunnel-node`: proxy (the daemon; the default, as in ztunnel), version, demo, help.
// Exit codes: 0 ok, 1 runtime failure, 2 configuration error (message on stderr).
// Each command loads what it needs: the daemon runs for weeks, and the demo's and `authz`'s modules (child_process,
// dns, readline, the SOCKS5 and Prometheus text clients) would stay loaded in it for nothing.
import { startupOffThread, type Startup } from '../config/off-thread.js';
import { isConfigError } from '../errors.js';
import { runProxy } from '../lifecycle/proxy.js';
import { createLogs } from '../log/logger.js';
import { nativeVersion } from '../native/index.js';
import { packageVersion } from '../version.js';

export const EXIT_OK = 0;
export const EXIT_FAILURE = 1;
export const EXIT_CONFIG = 2;

const USAGE = `usage: ztunnel-node <command> [flags]

commands:
  proxy [args...]     run the node proxy (default; extra arguments are recorded as config.proxyArgs)
  version             print the version and the native build
  authz check ...     explain how a running daemon's L4 authorization decides a connection
  authz preview FILE  what candidate policies would close and allow on a running daemon, without applying them
  demo                two proxies on loopback, one mTLS connection between them, and what it looked like
  help                this text ("<command> --help" for a command's flags)
`;

/** The flags' table, from the schema (loaded for it: the daemon itself never loads the schema on this thread). */
async function proxyUsage(): Promise<string> {
  const { CONFIG_KEYS, describeKey, flagFor } = await import('../config/schema.js');
  const rows = CONFIG_KEYS.map((key) => {
    const flag = `${flagFor(key)} <value>`;
    return `  ${flag.padEnd(44)} ${key}\n  ${''.padEnd(44)}   ${describeKey(key)}`;
  });
  return `usage: ztunnel-node proxy [args...] [flags]

Every flag has an environment variable of the same name (flags win). Durations: 500ms, 10s, 5m, 1h30m.

${rows.join('\n')}
`;
}

const isHelp = (a: string) => a === '--help' || a === '-h' || a === 'help';

/** What the installed command may have begun before `main` (bin/ztunnel-node.js): the proxy's startup parse. */
export interface Begun {
  /** `startupOffThread` of the same env and of the arguments `main` gives `proxy`. */
  startup?: Promise<Startup>;
}

export async function main(argv: readonly string[], env: Readonly<Record<string, string | undefined>>, begun: Begun = {}): Promise<number> {
  const [first, ...rest] = argv;
  // ztunnel runs the proxy when no command is given; flags alone mean the same.
  const command = first === undefined || (first.startsWith('-') && !isHelp(first)) ? 'proxy' : first;
  const args = command === 'proxy' && first !== 'proxy' ? [...argv] : rest;
  switch (command) {
    case 'help':
    case '--help':
    case '-h':
      process.stdout.write(USAGE);
      return EXIT_OK;
    case 'proxy':
      if (args.some(isHelp)) {
        process.stdout.write(await proxyUsage());
        return EXIT_OK;
      }
      return proxy(begun.startup ?? startupOffThread({ env, args, allArgs: argv }));
    case 'version':
      if (args.some(isHelp)) {
        process.stdout.write('usage: ztunnel-node version\n');
        return EXIT_OK;
      }
      return version();
    case 'authz':
      return (await import('./authz.js')).runAuthz(args, env);
    case 'demo': {
      const { DEMO_USAGE, runDemo } = await import('./demo.js');
      if (args.some(isHelp)) {
        process.stdout.write(DEMO_USAGE);
        return EXIT_OK;
      }
      return runDemo(args, env);
    }
    default:
      process.stderr.write(`ztunnel-node: unknown command "${command}"\n\n${USAGE}`);
      return EXIT_CONFIG;
  }
}

/** `startup`: the config parsed in a worker thread, and the first local config load (config/off-thread.ts). */
async function proxy(startup: Promise<Startup>): Promise<number> {
  let config, firstLocalLoad;
  try {
    ({ config, firstLocalLoad } = await startup);
  } catch (err) {
    return reportStartupError(err);
  }
  const logs = createLogs({ filter: config.logFilter, format: config.logFormat });
  try {
    const handle = await runProxy(config, logs, { firstLocalLoad });
    // The proxy's own handlers go once it has shut down; a signal that arrives while the process exits must not
    // end it by the signal (its exit status is the drain's).
    const exiting = (): void => undefined;
    process.on('SIGTERM', exiting);
    process.on('SIGINT', exiting);
    return await handle.closed;
  } catch (err) {
    if (isConfigError(err)) return reportStartupError(err);
    logs.root.fatal({ err: err instanceof Error ? err.message : String(err), code: (err as { code?: string }).code }, 'ztunnel-node failed to start');
    return EXIT_FAILURE;
  }
}

function reportStartupError(err: unknown): number {
  if (isConfigError(err)) {
    process.stderr.write(`ztunnel-node: ${err.message}\n`);
    return EXIT_CONFIG;
  }
  process.stderr.write(`ztunnel-node: ${err instanceof Error ? err.message : String(err)}\n`);
  return EXIT_FAILURE;
}

function version(): number {
  process.stdout.write(`ztunnel-node ${packageVersion()}\n`);
  try {
    const v = nativeVersion();
    process.stdout.write(
      `native: ${v.version} (${v.buildProfile} build)\ncrypto provider: ${v.cryptoProvider}\nrust version: ${v.rustVersion ?? 'unknown'}\n`,
    );
    return EXIT_OK;
  } catch (err) {
    process.stderr.write(`ztunnel-node: ${err instanceof Error ? err.message : String(err)}\n`);
    return EXIT_FAILURE;
  }
}

// Run when executed (bin/ztunnel-node.js imports this module), not when imported by tests.
export async function run(begun: Begun = {}): Promise<void> {
  const code = await main(process.argv.slice(2), process.env, begun);
  // Exit explicitly: a native runtime or a stray handle must not keep a finished command alive.
  process.exit(code);
}
