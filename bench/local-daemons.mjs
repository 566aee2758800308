// Local-mode daemon pairs for the single-question benchmarks (bench/resilience.mjs, bench/otlp-export.mjs): each
// daemon a real `ztunnel-node proxy` run with the image's Node flags (daemon-flags.mjs), sharing one built-in CA and
// one local config, its admin, stats and readiness on `adminIp(k)`. The children are killed when the process exits.
import { spawn } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parsePrometheusText } from '../dist/cli/prom-text.js';
import { DAEMON_NODE_FLAGS } from './daemon-flags.mjs';

const repo = join(dirname(fileURLToPath(import.meta.url)), '..');
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** The children to kill at exit (other processes a benchmark starts may join). */
export const children = new Set();
process.on('exit', () => {
  for (const c of children) c.kill('SIGKILL');
});

/** A daemon factory for `config` (a local config file) in `tmp`; `adminIp(k)` is daemon k's address. */
export function localDaemons({ tmp, config, adminIp, rustLog = 'warn' }) {
  return {
    /** Starts node `node` as daemon `k` with `extra` environment; resolves once it is ready. */
    async start(node, k, extra = {}) {
      const env = {
        PATH: process.env.PATH, HOME: process.env.HOME ?? '/tmp', PROXY_MODE: 'local', NODE_NAME: node,
        LOCAL_XDS_PATH: config, LOCAL_CA_DIR: join(tmp, 'ca'), ADMIN_ADDR: `${adminIp(k)}:15000`,
        STATS_ADDR: `${adminIp(k)}:15020`, READINESS_ADDR: `${adminIp(k)}:15021`,
        HANDOVER_SOCKET: join(tmp, `handover-${k}.sock`), RUST_LOG: rustLog, ...extra,
      };
      const child = spawn(process.execPath, [...DAEMON_NODE_FLAGS, join(repo, 'bin', 'ztunnel-node.js'), 'proxy'], { env, stdio: ['ignore', 'ignore', 'inherit'] });
      children.add(child);
      const daemon = {
        child,
        /** Its /metrics, parsed. */
        metrics: async () => parsePrometheusText(await (await fetch(`http://${adminIp(k)}:15020/metrics`)).text()),
        async stop() {
          const exited = new Promise((r) => child.once('exit', r));
          child.kill('SIGTERM');
          await exited;
          children.delete(child);
        },
      };
      for (let i = 0; i < 600; i++) {
        if (await fetch(`http://${adminIp(k)}:15021/healthz/ready`).then((r) => r.status === 200, () => false)) return daemon;
        await sleep(50);
      }
      throw new Error(`${node} did not become ready`);
    },
  };
}
