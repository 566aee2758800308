// The local config worker thread (started by local-loader.ts for each load): runs one load (local-prepare.ts) and
// posts its answer, transferring the policy chunks' buffers, then ends.
import { parentPort, workerData } from 'node:worker_threads';
import { prepareLoad, type FromWorker, type LocalWorkerData } from './local-prepare.js';

if (parentPort !== null) {
  const port = parentPort;
  prepareLoad(workerData as LocalWorkerData).then(
    ({ message, transfer }) => port.postMessage(message, transfer),
    // prepareLoad answers its own failures; this is for a bug past it (the daemon then hears of it instead of waiting).
    (err: unknown) => port.postMessage({ op: 'failed', message: err instanceof Error ? err.message : String(err) } satisfies FromWorker),
  );
}
