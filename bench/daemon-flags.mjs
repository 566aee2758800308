// The Node flags every benchmark starts a daemon with: the ones the image's ENTRYPOINT (Dockerfile) and `npm start`
// run it with, so that what is measured is what operators run. DAEMON_NODE_ARGS adds more (e.g. `--cpu-prof
// --cpu-prof-dir=/tmp/prof`).
//
// --max-semi-space-size=1: V8's young generation at 2 x 1 MiB instead of 2 x 16 MiB. The daemon's JS allocates little
// between state batches (nothing per connection); measured in bench/results/README.md ("The Node footprint").
export const DAEMON_NODE_FLAGS = ['--max-semi-space-size=1', ...(process.env.DAEMON_NODE_ARGS?.split(' ').filter(Boolean) ?? [])];
