// What a suite needs beyond Node and the daemon, asked of the one list in scripts/tools.mjs: the Python interpreter of
// the project's virtual environment (with the pinned packages npm test installs there), the Debian commands .ci/run
// installs, root. Each `skipWithout*` answers a test's `skip` option: false when it can run, else one line naming what
// is missing and the command that brings it. Under CI (CI set) it is always false: .ci/run brings everything, so a
// missing piece there must fail the test rather than skip it.
//
//   test('asks with dig', { skip: skipWithoutCommand('dig') }, ...)
//   spawn(PYTHON, [script])
import { existsSync } from 'node:fs';

/** The part of scripts/tools.mjs the suites use (it is JavaScript that node runs directly, outside this build). */
interface ToolsModule {
  VENV_PYTHON: string;
  /** The OpenTelemetry Collector's path, and its build where missing or stale. */
  COLLECTOR: string;
  ensureCollector(log?: (line: string) => void): void;
  debianMissing(command: string): string | null;
  pythonMissing(name: string): string | null;
}

/** scripts/tools.mjs, loaded from the source tree (the same path from test/helpers and dist-test/helpers). */
export const tools = (await import(new URL('../../scripts/tools.mjs', import.meta.url).href)) as ToolsModule;

/**
 * The interpreter the suites run their Python helpers with: the project's virtual environment's (npm test makes it),
 * else the `python3` on PATH (enough for the helpers that need only the standard library).
 */
export const PYTHON: string = existsSync(tools.VENV_PYTHON) ? tools.VENV_PYTHON : 'python3';

const isCi = (): boolean => Boolean(process.env.CI);

/** A test's `skip` for the PyPI package `name` (scripts/tools.mjs PYTHON_PACKAGES) in PYTHON. */
export function skipWithoutPython(name: string): string | false {
  if (isCi()) return false;
  return tools.pythonMissing(name) ?? false;
}

/** A test's `skip` for the Debian command `command` (scripts/tools.mjs DEBIAN_PACKAGES). */
export function skipWithoutCommand(command: string): string | false {
  if (isCi()) return false;
  return tools.debianMissing(command) ?? false;
}

/** Root: network namespaces, iptables. */
export const isRoot = (): boolean => typeof process.getuid === 'function' && process.getuid() === 0;

/** A test's `skip` for root (`what`: what it does with it). Under CI too: CI runs as root, so this never skips there. */
export function skipWithoutRoot(what = 'network namespaces, iptables'): string | false {
  return isRoot() ? false : `needs root (${what}): run npm test as root, as CI does`;
}

/** The first of several `skip` answers that skips, or false. */
export function skipWithout(...answers: (string | false)[]): string | false {
  return answers.find((a) => a !== false) ?? false;
}
