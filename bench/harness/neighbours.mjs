// CPU-bound neighbour processes: the rounds of a benchmark run beside them when asked (`--neighbours N`), as on a
// busy node (run.mjs, profile-rr.mjs).
import { spawn } from 'node:child_process';

/** `n` CPU-bound processes (a busy loop each), for the rounds under load; ended by `stopNeighbours`. */
export function startNeighbours(n) {
  // Named, so a profile of the machine tells them from the daemons' own Node threads (profile-rr.mjs).
  const busy = "process.title = 'ztn-neighbour'; for (;;);";
  const children = Array.from({ length: n }, () => spawn(process.execPath, ['-e', busy], { stdio: 'ignore' }));
  // A run that fails or is interrupted must not leave them spinning.
  process.once('exit', () => children.forEach((c) => c.kill('SIGKILL')));
  return children;
}

export async function stopNeighbours(children) {
  await Promise.all(children.map((c) => new Promise((r) => {
    if (c.exitCode !== null || c.signalCode !== null) return r();
    c.once('exit', r);
    c.kill('SIGKILL');
  })));
}
