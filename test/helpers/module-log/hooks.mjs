// Module customization hooks (node:module register) that append every module URL the process loads to the file
// named by ZTN_MODULE_LOG: a test reads which modules a daemon loaded, as Node resolved them.
import { appendFileSync } from 'node:fs';

const file = process.env.ZTN_MODULE_LOG;

export async function load(url, context, next) {
  if (file) appendFileSync(file, `${url}\n`);
  return next(url, context);
}
