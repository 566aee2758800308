// A real native dataplane for the state tests: the mesh lives there (state/store.ts), so a store test without one
// would test a stand-in. Nothing is bound or dialed; `shutdown()` when done.
import { loadConfig } from '../../dist/config/index.js';
import { dataplaneConfig } from '../../dist/lifecycle/dataplane.js';
import { Dataplane } from '../../dist/native/index.js';

export interface NativeDataplaneOptions {
  /** NODE_NAME. Default 'n1'. */
  nodeName?: string;
}

export function openNativeDataplane({ nodeName = 'n1' }: NativeDataplaneOptions = {}): Dataplane {
  const config = loadConfig({ env: { NODE_NAME: nodeName, ZTUNNEL_WORKER_THREADS: '1' } });
  return Dataplane.open(dataplaneConfig(config));
}
