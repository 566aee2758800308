// Reloading the local config file (LOCAL_XDS_PATH): the daemon polls the file's size and mtime and, once they
// have changed and then held still for a moment, calls `reload`. The settle delay matters: a writer that truncates
// and then writes (`cat > file`, fs.writeFile) is seen mid-way as an empty or partial file, which is valid YAML for
// "no workloads" and would tear every listener down. `reload` reads, validates and applies the file (the daemon
// does it through the local config worker, local-loader.ts, and applies only what changed; an invalid file is
// reported with its file, path and problem, and the last good config keeps serving). Reloads never overlap: a
// change seen while one runs is read after it. Polling (fs.watchFile) rather than inotify: editors and ConfigMap
// mounts replace the file by rename, which a watch on the old inode would miss.
import { unwatchFile, watchFile, type Stats } from 'node:fs';

/** Often enough that a policy change reaches live connections well within a second. */
export const LOCAL_CONFIG_POLL_MS = 100;
/** A change is read once the file has not changed for this long (more than one poll interval). */
export const LOCAL_CONFIG_SETTLE_MS = 250;

export interface LocalConfigWatch {
  stop(): void;
}

/** Calls `reload` each time the file at `path` has changed and settled; a rejection is passed to `onError`. */
export function watchLocalConfig(path: string, reload: () => Promise<void>, onError: (err: unknown) => void): LocalConfigWatch {
  let running: Promise<void> = Promise.resolve();
  let settle: NodeJS.Timeout | null = null;
  let stopped = false;
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
  const listener = (curr: Stats, prev: Stats) => {
    if (curr.mtimeMs === prev.mtimeMs && curr.size === prev.size && curr.ino === prev.ino) return;
    if (settle !== null) clearTimeout(settle);
    settle = setTimeout(schedule, LOCAL_CONFIG_SETTLE_MS);
    settle.unref();
  };
  watchFile(path, { interval: LOCAL_CONFIG_POLL_MS, persistent: false }, listener);
  return {
    stop: () => {
      stopped = true;
      if (settle !== null) clearTimeout(settle);
      unwatchFile(path, listener);
    },
  };
}
