#!/usr/bin/env node
// The installed command. All logic lives in dist/ (compiled from ts/).
// `proxy` binds its readiness address first, before the daemon's modules load (about a second): the probe is
// answered "not ready" from the first moment instead of refused (admin/early-readiness.ts). Node 22 and later load a
// module graph without turning the event loop, so the heavy parts are loaded one at a time, with the loop turned
// between them: the early server answers in those gaps (each under ~0.2 s). Meanwhile a worker thread parses the
// config and makes the first local config load (config/off-thread.ts), on the other core.
const begun = {};
if (process.argv[2] === 'proxy') {
  const { bindEarlyReadiness } = await import('../dist/admin/early-readiness.js');
  bindEarlyReadiness(process.env, process.argv.slice(3));
  const { startupOffThread } = await import('../dist/config/off-thread.js');
  // The arguments as `main` gives them to `proxy`; a rejection is `main`'s to report.
  begun.startup = startupOffThread({ env: process.env, args: process.argv.slice(3), allArgs: process.argv.slice(2) });
  begun.startup.catch(() => undefined);
  const turn = () => new Promise((resolve) => setTimeout(resolve, 1));
  // gRPC loads only with an istiod to talk to (the daemon imports it then too; named here so that it loads in a turn
  // of its own). As the config reads it: every mode but local has istiod by default; local only when named.
  const { PROXY_MODE, XDS_ADDRESS, CA_ADDRESS } = process.env;
  const istiod = (PROXY_MODE ?? 'shared') !== 'local' || Boolean(XDS_ADDRESS || CA_ADDRESS);
  for (const part of [...(istiod ? ['@grpc/grpc-js'] : []), 'pino', '../dist/admin/metrics.js', '../dist/lifecycle/proxy.js']) {
    await turn();
    await import(part);
  }
  await turn();
}
const { run } = await import('../dist/cli/main.js');

await run(begun);
