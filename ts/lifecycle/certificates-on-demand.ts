// Certificates on demand: the dataplane's handshakes that find no certificate (a local workload's inbound HBONE
// listener, an HBONE pool connection for a source identity) wait for one and ask for it; this loop answers each ask
// with a RealTime request to the certificate manager, which jumps the prefetch and refresh queue. Prefetch for local
// workloads stays an optimisation: without it the first connection waits for the CA once.
//
// The ask is a long poll (`nextCertificateRequests` resolves when there is at least one identity), so an ask costs
// one wake-up of the event loop, not a timer. It ends when the dataplane drains or shuts down (an empty answer or a
// rejection), or on `stop()`.
import type { Logger } from 'pino';
import type { PriorityName } from '../ca/manager.js';

export interface CertificateAsks {
  nextCertificateRequests(): Promise<string[]>;
}

export interface CertificateSource {
  ensure(identity: string, priority?: PriorityName): Promise<boolean>;
}

export function answerCertificateRequests(plane: CertificateAsks, certs: CertificateSource, log: Logger): { stop(): void; done: Promise<void> } {
  let stopped = false;
  const done = (async () => {
    while (!stopped) {
      let asked: string[];
      try {
        asked = await plane.nextCertificateRequests();
      } catch (err) {
        if (!stopped) log.debug({ err: err instanceof Error ? err.message : String(err) }, 'certificate requests ended');
        return;
      }
      if (asked.length === 0 || stopped) return;
      for (const identity of asked) {
        log.info({ identity }, 'certificate requested on demand by the dataplane');
        certs.ensure(identity, 'RealTime').then(
          (ok) => {
            if (!ok && !stopped) log.warn({ identity }, 'certificate requested on demand could not be obtained');
          },
          (err: unknown) => {
            if (!stopped) log.warn({ identity, err: err instanceof Error ? err.message : String(err) }, 'certificate requested on demand could not be obtained');
          },
        );
      }
    }
  })();
  return {
    stop: () => {
      stopped = true;
    },
    done,
  };
}
