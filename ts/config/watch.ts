// Reloading the local config file (LOCAL_XDS_PATH): the daemon polls the file's size, mtime and inode and, once they
// have changed and then held still for a moment, calls `reload`. The settle delay matters: a writer that truncates
// and then writes (`cat > file`, fs.writeFile) is seen mid-way as an empty or partial file, which is valid YAML for
// "no workloads" and would tear every listener down. `reload` reads, validates and applies the file (the daemon
// does it through the local config worker, local-loader.ts, and applies only what changed; an invalid file is
// reported with its file, path and problem, and the last good config keeps serving). Reloads never overlap: a
// change seen while one runs is read after it. Polling rather than inotify: editors and ConfigMap mounts replace the
// file by rename, which a watch on the old inode would miss.
//
// The polls are a JS interval around an asynchronous stat, as fs.watchFile's are inside libuv: the stat stays off
// the event loop as before, and, unlike libuv's timer, the interval and the settle delay are JS timers that tests
// drive on node:test's mock timers instead of waiting on real time.
import { stat as statFile } from 'node:fs/promises';

/** Often enough that a policy change reaches live connections well within a second. */
export const LOCAL_CONFIG_POLL_MS = 100;
/** A change is read once the file has not changed for this long (more than one poll interval). */
export const LOCAL_CONFIG_SETTLE_MS = 250;

/** What a poll compares: a rewrite changes the size or the mtime, a replacement by rename the inode. */
export interface FileState {
  mtimeMs: number;
  size: number;
  ino: number;
}

/** An absent or unreadable file, as fs.watchFile reports it: its appearing is a change, its staying away is not. */
const ABSENT: FileState = { mtimeMs: 0, size: 0, ino: 0 };

/** The file's state as a poll takes it (ABSENT when it cannot be read). */
export function fileState(path: string, stat: (path: string) => Promise<FileState> = statFile): Promise<FileState> {
  return stat(path).then(({ mtimeMs, size, ino }) => ({ mtimeMs, size, ino }), () => ABSENT);
}

export interface LocalConfigWatch {
  /** Settles once the file's starting state is taken: a change made after that is reloaded. */
  readonly ready: Promise<void>;
  stop(): void;
}

export interface LocalConfigWatchOptions {
  /** fs.promises.stat unless given: a test passes one that lets it know when each poll's stat has completed. */
  stat?: (path: string) => Promise<FileState>;
  /**
   * The file's state when the loaded document was read, if that was before the watch (the daemon's first load is
   * made at its start, config/off-thread.ts): the starting state then, so a change made in between is reloaded.
   * Absent: the state at the watch's start.
   */
  since?: FileState;
}

/** Calls `reload` each time the file at `path` has changed and settled; a rejection is passed to `onError`. */
export function watchLocalConfig(
  path: string,
  reload: () => Promise<void>,
  onError: (err: unknown) => void,
  { stat = statFile, since }: LocalConfigWatchOptions = {},
): LocalConfigWatch {
  let running: Promise<void> = Promise.resolve();
  let settle: NodeJS.Timeout | null = null;
  let stopped = false;
  let polling = false;
  let last: FileState | null = since ?? null;
  const schedule = () => {
    settle = null;
    // Serialize reloads: a slow parse must not let an older file win over a newer one.
    running = running.then(async () => {
      if (stopped) return;
      try {
        await reload();
      } catch (err) {
        onError(err);
      }
    });
  };
  const poll = async () => {
    // One stat at a time: the polls a slow stat overlaps are skipped, not stacked (libuv's fs poll waits likewise).
    if (polling) return;
    polling = true;
    const curr = await fileState(path, stat);
    polling = false;
    const prev = last;
    last = curr;
    if (stopped || prev === null) return;
    if (curr.mtimeMs === prev.mtimeMs && curr.size === prev.size && curr.ino === prev.ino) return;
    if (settle !== null) clearTimeout(settle);
    settle = setTimeout(schedule, LOCAL_CONFIG_SETTLE_MS);
    settle.unref();
  };
  // Not persistent: the watch alone never keeps the process alive.
  const timer = setInterval(() => {
    poll().catch(onError);
  }, LOCAL_CONFIG_POLL_MS);
  timer.unref();
  return {
    ready: poll(),
    stop: () => {
      stopped = true;
      clearInterval(timer);
      if (settle !== null) clearTimeout(settle);
    },
  };
}
