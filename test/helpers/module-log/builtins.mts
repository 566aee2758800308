// `node --import <this file>`: when the process exits, writes the Node builtin modules it loaded (its
// process.moduleLoadList, the `NativeModule` entries: internal ones too, which module hooks never see) to the file named
// by ZTN_BUILTIN_LOG, one a line.
import { writeFileSync } from 'node:fs';

const file = process.env.ZTN_BUILTIN_LOG;
if (file) {
  process.on('exit', () => {
    // process.moduleLoadList: internal, not in Node's type declarations.
    const names = (process as NodeJS.Process & { moduleLoadList: string[] }).moduleLoadList.filter((m) => m.startsWith('NativeModule ')).map((m) => m.slice('NativeModule '.length));
    writeFileSync(file, `${names.join('\n')}\n`);
  });
}
