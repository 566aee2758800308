#!/usr/bin/env node
// The installed command. All logic lives in dist/ (compiled from ts/).
// `proxy` binds its readiness address first, before the daemon's modules load (about a second): the probe is
// answered "not ready" from the first moment instead of refused (admin/early-readiness.ts).
if (process.argv[2] === 'proxy') {
  const { bindEarlyReadiness } = await import('../dist/admin/early-readiness.js');
  bindEarlyReadiness(process.env, process.argv.slice(3));
}
const { run } = await import('../dist/cli/main.js');

await run();
