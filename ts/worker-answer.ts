// A worker thread asked one thing: started with its data, it posts one answer and ends (the config's parse,
// config/config-worker.ts; a policy preview's parse, admin/preview-worker.ts). What it loaded and allocated goes
// with it, which is why these run there and not on the daemon's main thread.
import { Worker } from 'node:worker_threads';

/**
 * Runs the worker at `url` with `workerData`; resolves with its one answer once it has ended (its memory is then
 * being given back), rejects if it fails or ends without one. `name` names it in that error.
 */
export function workerAnswer<T>(url: URL, workerData: unknown, name: string): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    let answer: { value: T } | null = null;
    const worker = new Worker(url, { workerData });
    worker.once('message', (m: T) => {
      answer = { value: m };
    });
    worker.once('error', reject);
    worker.once('exit', (code) => {
      if (answer === null) reject(new Error(`the ${name} worker ended (exit code ${code}) without an answer`));
      else resolve(answer.value);
    });
  });
}
