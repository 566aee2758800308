// Hand-over between two daemons of one node (native/dataplane/src/handover): the successor takes the predecessor's
// established connections before it reports ready, then serves the socket for its own successor; the predecessor,
// once a successor has spoken to it, drains what it kept and exits as on SIGTERM.
//
// All of it is native: the sockets, the bytes and the exchange never touch JavaScript. This side only says when,
// logs each hand-over in one line and counts it.
import type { Logger } from 'pino';
import type { HandoverTotals } from '../admin/metrics.js';
import type { HandoverReport } from '../native/types.js';

export interface HandoverPort {
  handoverTake(path: string): Promise<HandoverReport>;
  handoverListen(path: string, replace: boolean): void;
  nextHandover(): Promise<HandoverReport | null>;
}

export interface HandoverCounts {
  /** A hand-over that completed or did not, from either side. */
  observe(report: HandoverReport): void;
}

/** The metrics' totals, kept from each report. */
export class HandoverTally implements HandoverCounts, HandoverTotals {
  readonly exchanges = new Map<string, number>();
  readonly connections = new Map<string, number>();
  readonly lastDurationSeconds = new Map<string, number>();
  lastPauseSeconds: number | null = null;

  observe(r: HandoverReport): void {
    const bump = (m: Map<string, number>, k: string, n = 1) => m.set(k, (m.get(k) ?? 0) + n);
    bump(this.exchanges, `${r.role}/${r.error === undefined ? 'done' : 'failed'}`);
    if (r.role === 'take') bump(this.connections, 'taken', r.connections);
    else {
      bump(this.connections, 'given', r.connections);
      bump(this.connections, 'kept', r.kept);
      this.lastPauseSeconds = r.pauseMs / 1000;
    }
    this.lastDurationSeconds.set(r.role, r.durationMs / 1000);
  }
}

export interface HandoverOptions {
  dp: HandoverPort;
  socket: string;
  /** NODE_NAME: only a daemon of the same node hands over (the native side checks it on both ends). */
  nodeName: string;
  log: Logger;
  counts: HandoverCounts;
  /** A successor spoke to this daemon: drain what is left and exit. */
  onSuccessor(report: HandoverReport): void;
  signal: AbortSignal;
  /** How often to try the socket's name while another daemon serves it (LISTEN_RETRY_MS). */
  listenRetryMs?: number;
}

/** A report's fields as one log line. */
function fields(r: HandoverReport): Record<string, unknown> {
  const out: Record<string, unknown> = {
    connections: r.connections,
    durationMs: Math.round(r.durationMs * 10) / 10,
    peerPid: r.peerPid,
    waves: r.waves,
  };
  if (r.role === 'give') {
    out.kept = r.kept;
    out.pauseMs = Math.round(r.pauseMs * 10) / 10;
    out.phasesMs = r.phasesMs.map((x) => Math.round(x * 10) / 10);
  }
  if (r.error !== undefined) out.error = r.error;
  return out;
}

/**
 * Take over from a predecessor serving `socket`, if there is one, then serve it. Resolves with the take's report once
 * this daemon listens; a successor that comes later is announced through `onSuccessor`.
 */
export async function takeOverThenServe(o: HandoverOptions): Promise<HandoverReport> {
  const taken = await o.dp.handoverTake(o.socket);
  if (taken.found) {
    o.counts.observe(taken);
    const line = { ...fields(taken), socket: o.socket };
    if (taken.error === undefined) o.log.info(line, 'hand-over taken');
    else if (taken.waves > 0) o.log.warn(line, 'hand-over taken in part: the waves committed before the failure run here, the predecessor keeps and drains the rest');
    else o.log.warn(line, 'hand-over not taken: the predecessor keeps its connections and drains them');
  }
  // After a take (done or not) from a daemon of this node, that daemon is leaving: its socket's name is ours. One
  // that refused for another reason keeps it until it exits: listen once it is gone.
  const replace = taken.found && taken.peerNode === o.nodeName;
  const listen = (): boolean => {
    try {
      o.dp.handoverListen(o.socket, replace);
      return true;
    } catch (err) {
      if (replace || !/served by a running daemon/.test(err instanceof Error ? err.message : '')) throw err;
      return false;
    }
  };
  const onFailure = (err: unknown) => o.log.error({ err: err instanceof Error ? err.message : String(err), socket: o.socket }, 'hand-over socket: serving failed');
  if (listen()) serve(o).catch(onFailure);
  else {
    o.log.warn({ socket: o.socket, peerNode: taken.peerNode }, 'hand-over socket served by another daemon: listening once it is gone');
    const retry = setInterval(() => {
      if (o.signal.aborted) return clearInterval(retry);
      try {
        if (!listen()) return;
        clearInterval(retry);
        serve(o).catch(onFailure);
      } catch (err) {
        clearInterval(retry);
        onFailure(err);
      }
    }, o.listenRetryMs ?? LISTEN_RETRY_MS);
    retry.unref();
  }
  return taken;
}

/** How often a successor whose predecessor did not hand over tries to take the socket's name. */
const LISTEN_RETRY_MS = 1_000;

async function serve(o: HandoverOptions): Promise<void> {
  for (;;) {
    const report = await o.dp.nextHandover().catch(() => null);
    if (report === null) return;
    // A daemon already draining (its SIGTERM came first: a kubelet may stop the old pod as soon as the new one is
    // ready) still gives what it holds; it is logged and counted, and the drain under way ends it.
    o.counts.observe(report);
    const line = { ...fields(report), socket: o.socket };
    // Only a daemon of this node that spoke the protocol ends this one (a bad connection to the socket, or a daemon
    // of another node given this socket by mistake, does not).
    if (report.peerVersion === 0) {
      o.log.warn(line, 'hand-over socket: a peer that does not speak the protocol');
      continue;
    }
    if (report.otherNode) {
      o.log.warn({ ...line, peerNode: report.peerNode }, 'hand-over refused: the peer serves another node (two nodes given one HANDOVER_SOCKET)');
      continue;
    }
    if (report.error === undefined) o.log.info(line, 'hand-over given');
    else if (report.waves > 0) o.log.warn(line, 'hand-over failed midway: the waves committed before it went to the successor, the rest stay here and drain');
    else o.log.warn(line, 'hand-over failed: every connection stays here and drains');
    if (!o.signal.aborted) o.onSuccessor(report);
    return;
  }
}
