// The XDS client's counters, named as ztunnel's: istio_xds_connection_terminations_total{reason},
// istio_xds_message_total{url}, istio_xds_message_bytes_total{url}. Counted here, rendered by ts/admin/metrics.ts.

export interface XdsCounters {
  terminations: Record<string, number>;
  messages: Record<string, number>;
  bytes: Record<string, number>;
}

export class XdsMetrics {
  private readonly counters: XdsCounters = { terminations: {}, messages: {}, bytes: {} };

  termination(reason: string): void {
    this.counters.terminations[reason] = (this.counters.terminations[reason] ?? 0) + 1;
  }

  message(url: string, bytes: number): void {
    this.counters.messages[url] = (this.counters.messages[url] ?? 0) + 1;
    this.counters.bytes[url] = (this.counters.bytes[url] ?? 0) + bytes;
  }

  snapshot(): XdsCounters {
    return {
      terminations: { ...this.counters.terminations },
      messages: { ...this.counters.messages },
      bytes: { ...this.counters.bytes },
    };
  }
}
