// Module customization hooks (node:module register) that append every module URL the process loads to the file
// named by ZTN_MODULE_LOG: a test reads which modules a daemon loaded, as Node resolved them, in any of its threads.
// With ZTN_MODULE_EDGES set, every resolution is appended there too as `<parent URL>\t<URL>` (the parent empty for a
// thread's entry point): what the main thread loaded is then what is reachable from its entry (`mainThreadModules`).
import { appendFileSync } from 'node:fs';
import type { LoadFnOutput, LoadHook, LoadHookContext, ResolveFnOutput, ResolveHook, ResolveHookContext } from 'node:module';

const file = process.env.ZTN_MODULE_LOG;
const edges = process.env.ZTN_MODULE_EDGES;

export async function resolve(specifier: string, context: ResolveHookContext, next: Parameters<ResolveHook>[2]): Promise<ResolveFnOutput> {
  const resolved = await next(specifier, context);
  if (edges) appendFileSync(edges, `${context.parentURL ?? ''}\t${resolved.url}\n`);
  return resolved;
}

export async function load(url: string, context: LoadHookContext, next: Parameters<LoadHook>[2]): Promise<LoadFnOutput> {
  if (file) appendFileSync(file, `${url}\n`);
  return next(url, context);
}
