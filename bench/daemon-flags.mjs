// The Node flags every benchmark starts a daemon with: the ones the image's ENTRYPOINT (Dockerfile) and `npm start`
// run it with, so that what is measured is what operators run. DAEMON_NODE_ARGS adds more (e.g. `--cpu-prof
// --cpu-prof-dir=/tmp/prof`).
//
// --max-semi-space-size=1: V8's young generation at 2 x 1 MiB instead of 2 x 16 MiB. The daemon's JS allocates little
// between state batches (nothing per connection); measured in bench/results/README.md ("The Node footprint").
// --max-opt=2: no TurboFan (Maglev stays on Node 22 and later; Node 20 has no Maglev by default, so there Sparkplug is
// the top tier). The optimizing compiler's own code is ~5 MiB of Node's binary that a daemon touches once at startup
// and keeps resident: idle RSS 4.7 MiB lower on Node 20, 4.9 on Node 24 (bench/idle-rss.mjs), 8-10 MiB lower after
// a 100k-workload load. Its cost, measured at 100k (bench/xds-scale.mjs, Node 20): first push and local file ready
// in the same time (noise), one update applied in 0.08 ms instead of 0.06 at p50 and its round trip through istiod in
// 0.87 ms instead of 0.55-0.65: JavaScript is on no connection's path, only on the control plane's.
// Their cost: any V8 flag makes V8 refuse Node's embedded code cache of its builtins (the cache carries the flags'
// hash), so every builtin compiles at start and keeps a fresh cache: about 1 MiB of malloc'd memory and 60-110 ms of
// start idle, 150-240 ms at 100k; against 5-9 MiB less RSS at 100k (bench/results/README.md, issue 31).
export const DAEMON_NODE_FLAGS = ['--max-semi-space-size=1', '--max-opt=2', ...(process.env.DAEMON_NODE_ARGS?.split(' ').filter(Boolean) ?? [])];
