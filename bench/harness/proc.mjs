// What the harness reads about a proxy process from /proc: CPU time (all threads) and memory.
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';

let clkTck;
function ticksPerSecond() {
  if (clkTck === undefined) {
    try {
      clkTck = Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100;
    } catch {
      clkTck = 100; // USER_HZ on every Linux architecture we build for
    }
  }
  return clkTck;
}

/** utime + stime of the whole process (every thread, live or exited), in seconds. */
export function cpuSeconds(pid) {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  // The command name may hold spaces and parentheses: fields are counted from after its closing ')'.
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // fields[0] is field 3 (state); utime is field 14, stime field 15.
  return (Number(fields[11]) + Number(fields[12])) / ticksPerSecond();
}

/**
 * { rss, hwm, rssAnon, rssFile } in bytes: resident now (VmRSS), the process's peak (VmHWM), and the resident
 * anonymous memory (heaps, stacks) apart from the file-backed pages (the Node binary, the native module, libraries).
 */
export function memory(pid) {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kib = (key) => Number(new RegExp(`^${key}:\\s+(\\d+) kB`, 'm').exec(status)?.[1] ?? NaN) * 1024;
  return { rss: kib('VmRSS'), hwm: kib('VmHWM'), rssAnon: kib('RssAnon'), rssFile: kib('RssFile') };
}

/** Sum of cpuSeconds over the pids. */
export const totalCpu = (pids) => pids.reduce((s, p) => s + cpuSeconds(p), 0);
