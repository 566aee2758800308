// The Node footprint (bench/results/README.md): a daemon loads what its mode needs. In local mode with the built-in
// CA there is no istiod to talk to, so gRPC and the generated protobuf code stay unloaded (with XDS_ADDRESS or
// CA_ADDRESS they load, as the xDS suites show by working). The modules are read as Node resolved them, through
// module hooks (test/helpers/module-log).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { makeTempDir, startDaemon, workload } from '../helpers/daemon.js';
import { BLOCKS, block } from '../helpers/net.js';

const net = block(BLOCKS['lazy-modules']);
const REGISTER = fileURLToPath(new URL('../helpers/module-log/register.mjs', import.meta.url));

test('a local-mode daemon does not load gRPC or the protobuf code', async (t) => {
  const dir = makeTempDir('ztn-lazy-');
  const log = join(dir, 'modules.txt');
  const config = { workloads: [workload({ name: 'a', ip: net.workload(1), node: 'node-a' })] };
  const d = await startDaemon({
    node: 'node-a',
    config,
    caDir: join(dir, 'ca'),
    adminIp: net.admin(1),
    env: { NODE_OPTIONS: `--import=${REGISTER}`, ZTN_MODULE_LOG: log },
    cleanup: t,
  });
  const loaded = readFileSync(log, 'utf8').split('\n').filter(Boolean);
  // The log is real: the daemon's own modules are in it.
  assert.ok(loaded.some((u) => u.endsWith('/dist/lifecycle/proxy.js')), 'the daemon module was logged');
  assert.ok(loaded.some((u) => u.includes('/node_modules/zod/')), 'the config schema (zod) was logged');
  assert.deepEqual(loaded.filter((u) => u.includes('/@grpc/') || u.includes('/@bufbuild/') || u.includes('/dist/gen/')), []);
  await d.stop();
});
