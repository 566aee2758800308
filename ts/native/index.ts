// The typed face of the native module. Everything crosses as one JSON string per call (docs/native-api.md); this
// file owns the stringify/parse and maps native error prefixes to the error catalog, so no other module sees raw
// JSON or message prefixes.
//
// The binding is loaded lazily: `ztunnel-node --help`, config errors and the unit tests must work on a machine
// that has no native binary yet.
import { createRequire } from 'node:module';
import type * as B from './binding.cjs';
import { fromNativeError, ZtunnelError } from '../errors.js';
import type { LogLevel } from '../log/filter.js';
import type {
  DedicatedSpec,
  SelfInboundSpec,
  OutlierEndpoint,
  HandoverReport,
  InPodConfig,
  InPodState,
  InPodWorkload,
  LocalDump,
  AuthorizeExplanation,
  AuthzPreview,
  AuthzPreviewRequest,
  AppliedOut,
  MeshDump,
  Service,
  Workload,
  AuthorizeRequest,
  ColdCodeReleased,
  DataplaneConfig,
  InstalledCertificate,
  BoundListeners,
  LocalWorkloadSpec,
  MetricsSnapshot,
  NativeEvent,
  NativeVersion,
  StateDelta,
} from './types.js';

export type * from './types.js';

type Binding = typeof B;

const require = createRequire(import.meta.url);
let binding: Binding | undefined;

/** `linux-x64-gnu`, `linux-arm64-musl`, `darwin-arm64`: the name a prebuilt binary would be published under. */
export function platformTag(): string {
  const base = `${process.platform}-${process.arch}`;
  if (process.platform !== 'linux') return base;
  const header = (process.report?.getReport() as { header?: { glibcVersionRuntime?: string } } | undefined)?.header;
  return `${base}-${header?.glibcVersionRuntime ? 'gnu' : 'musl'}`;
}

/**
 * The platforms a prebuilt binary is published for (package.json `napi.targets`, as napi-rs names them; a unit test
 * keeps the two lists equal). Linux only: the dataplane uses Linux socket APIs (network namespaces, SO_MARK,
 * IP_TRANSPARENT).
 */
export const PREBUILT_PLATFORMS: readonly string[] = ['linux-x64-gnu', 'linux-arm64-gnu', 'linux-x64-musl', 'linux-arm64-musl'];

/** npm package that carries the prebuilt binary for a platform tag (napi-rs naming: `<name>-<tag>`). */
export function platformPackage(tag: string): string {
  return `ztunnel-node-${tag}`;
}

/**
 * What to tell the user when neither the platform package nor a local build loads. Pure, so the wording is tested.
 * `causes` are the loader's individual failures (first line each); `override` is NAPI_RS_NATIVE_LIBRARY_PATH, which
 * makes the loader try only that file.
 */
export function nativeUnavailableMessage(tag: string, causes: readonly string[] = [], override?: string): string {
  const local = `a local build (ztunnel-node.${tag}.node next to the loader)`;
  const lines = override
    ? [
        `no native binary for ${tag}: NAPI_RS_NATIVE_LIBRARY_PATH=${override} is set, so only that file was tried, and it could not be loaded.`,
        `  unset it to use the prebuilt package ${platformPackage(tag)} or ${local}.`,
      ]
    : PREBUILT_PLATFORMS.includes(tag)
    ? [
        `no native binary for ${tag}: neither the prebuilt package ${platformPackage(tag)} nor ${local} could be loaded.`,
        `  installed from npm: reinstall with optional dependencies enabled (no --omit=optional / --no-optional), so npm installs ${platformPackage(tag)};`,
        '  in a source checkout: run `npm run build:native` (needs a Rust toolchain).',
      ]
    : [
        `no native binary for ${tag}: no prebuilt package is published for ${tag} (prebuilt: ${PREBUILT_PLATFORMS.join(', ')}) and ${local} could not be loaded.`,
        '  build one in a source checkout with `npm run build:native` (needs a Rust toolchain).',
      ];
  if (causes.length > 0) lines.push(`  tried: ${causes.join('; ')}`);
  return lines.join('\n');
}

/** The first line of each error in a `cause` chain (napi-rs chains its per-candidate load failures that way). */
function causeLines(err: unknown, max = 6): string[] {
  const out: string[] = [];
  for (let e: unknown = err; e instanceof Error && out.length < max; e = e.cause) {
    const line = e.message.split('\n')[0] ?? '';
    // The WASI fallbacks are tried everywhere and never shipped; naming them would only mislead.
    if (line !== '' && !line.startsWith('Cannot find native binding') && !/wasi/i.test(line)) out.push(line);
  }
  return out;
}

function load(): Binding {
  if (binding) return binding;
  try {
    // binding.cjs is the napi-rs loader; it tries NAPI_RS_NATIVE_LIBRARY_PATH, then a local build next to itself
    // (dist/native/), then the platform package. The native build copies it next to this file.
    binding = require('./binding.cjs') as Binding;
    return binding;
  } catch (err) {
    throw new ZtunnelError(
      'NATIVE_UNAVAILABLE',
      nativeUnavailableMessage(platformTag(), causeLines(err), process.env.NAPI_RS_NATIVE_LIBRARY_PATH || undefined),
      { cause: err },
    );
  }
}

function call<T>(fn: () => T): T {
  try {
    return fn();
  } catch (err) {
    throw fromNativeError(err);
  }
}

async function callAsync<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    throw fromNativeError(err);
  }
}

/**
 * One istio.workload.Address body decoded and validated exactly as the dataplane does it for WDS (tests, debugging):
 * the workload or service in the control side's model; throws the NACK reason.
 */
export function decodeAddress(body: Uint8Array): { workload?: Workload; service?: Service } {
  return JSON.parse(call(() => load().decodeAddress(body))) as { workload?: Workload; service?: Service };
}

/**
 * YAML text (the local config file) → the same document as JSON text, parsed natively (the `yaml` package takes about
 * 80 s for a 51 MiB file). Throws `Error("line L, column C: invalid YAML: ...")` for a bad document, and
 * NATIVE_UNAVAILABLE when there is no native binary.
 */
export function yamlToJson(text: string): string {
  const b = load();
  return b.yamlToJson(text);
}

/** What the dataplane made of a local document (`localPrepare`). */
export type PreparedLocal =
  /** Read and validated; held in the dataplane under `ticket` until `Dataplane.applyLocal` or `localDiscard`. */
  | { ticket: number; workloads: number; services: number; policies: unknown[] }
  /** Refused: each problem `<path>: <problem>` (at most 100 listed), and how many there are in all. */
  | { problems: string[]; total: number };

/**
 * The local config read by the dataplane (native/mesh/src/state/local.rs): the YAML file's bytes read straight into
 * validated workloads and services (their record types are the schema), held natively for `Dataplane.applyLocal`;
 * the policies come back as written, for the control side's schema. Runs on the calling thread (the loader's worker).
 */
export function localPrepare(text: Uint8Array): PreparedLocal {
  return JSON.parse(call(() => load().localPrepare(text))) as PreparedLocal;
}

/** A held local document's records, taken (it will not be applied), in the form a delta carries them. */
export function localRecords(ticket: number): { workloads: Workload[]; services: Service[] } {
  return JSON.parse(call(() => load().localRecords(ticket))) as { workloads: Workload[]; services: Service[] };
}

/** Drops a held local document that will not be applied (unknown or taken tickets are ignored). */
export function localDiscard(ticket: number): void {
  call(() => load().localDiscard(ticket));
}

/** Returns the process's free malloc heap to the kernel (after a large batch's garbage is collected). */
export function releaseFreeHeap(): void {
  call(() => load().releaseFreeHeap());
}

/**
 * Releases the resident pages of the executables' code (Node's binary, this module, the libraries) that hold only
 * their file's bytes: what startup ran once leaves the RSS, what runs again faults back in (native host/src/footprint.rs).
 */
export function releaseColdCode(): ColdCodeReleased {
  return JSON.parse(call(() => load().releaseColdCode())) as ColdCodeReleased;
}

/** Up to this many resources, an Address response is applied on the JS thread (well under a millisecond each). */
export const APPLY_NOW_RESOURCES = 64;

/** Each resource prefixed by its length (u32 little-endian), in one buffer: one crossing for a whole response. */
export function packResources(resources: readonly Uint8Array[]): Uint8Array {
  let total = 0;
  for (const r of resources) total += 4 + r.byteLength;
  const out = Buffer.allocUnsafe(total);
  let at = 0;
  for (const r of resources) {
    out.writeUInt32LE(r.byteLength, at);
    out.set(r, at + 4);
    at += 4 + r.byteLength;
  }
  return out;
}

/** One running dataplane (a tokio runtime inside the native module). Unusable after `shutdown()`. */
export class Dataplane {
  private constructor(private readonly inner: B.Dataplane) {}

  static open(cfg: DataplaneConfig): Dataplane {
    const { Dataplane: Native } = load();
    return new Dataplane(call(() => new Native(JSON.stringify(cfg))));
  }

  /** Throws ZtunnelError INVALID_STATE when rejected; the previous state stays. Returns what changed. */
  applyState(delta: StateDelta): AppliedOut {
    return JSON.parse(call(() => this.inner.applyState(JSON.stringify(delta)))) as AppliedOut;
  }

  /**
   * The chunks of one large delta (each a StateDelta as UTF-8 JSON), parsed, validated and applied as one off the JS
   * thread: rejects INVALID_STATE (nothing applied) when any chunk is bad.
   */
  async applyStateBatches(chunks: Uint8Array[]): Promise<AppliedOut> {
    return JSON.parse(await callAsync(() => this.inner.applyStateBatches(chunks))) as AppliedOut;
  }

  /**
   * Applies the local config document held under `ticket` with the compiled policy part of its change (StateDelta
   * chunks of policies only, UTF-8 JSON), as one change off the JS thread: what the last applied local document had
   * and this one lacks is removed; xDS records are not touched. Rejects (nothing applied) when a chunk is bad or the
   * ticket is not held.
   */
  async applyLocal(ticket: number, policyChunks: Uint8Array[]): Promise<AppliedOut> {
    return JSON.parse(await callAsync(() => this.inner.applyLocal(ticket, policyChunks))) as AppliedOut;
  }

  /**
   * One WDS response's Address resources (each an encoded envoy Resource) and removed names, decoded and applied
   * off the JS thread, resource by resource (`rejected` names the bad ones).
   */
  async applyAddresses(resources: readonly Uint8Array[], removed: string[]): Promise<AppliedOut> {
    const packed = packResources(resources);
    // A small response (an update) is applied on this thread: the hop to a pool thread and back costs more than it.
    if (resources.length + removed.length <= APPLY_NOW_RESOURCES) {
      return JSON.parse(call(() => this.inner.applyAddressesNow(packed, removed))) as AppliedOut;
    }
    return JSON.parse(await callAsync(() => this.inner.applyAddresses(packed, removed))) as AppliedOut;
  }

  /** config_dump's workloads, services and staged services, rendered from the dataplane's state. */
  meshDump(): MeshDump {
    return JSON.parse(call(() => this.inner.meshDump())) as MeshDump;
  }

  /** A PEM CSR for `identity` (a SPIFFE URI); the private key stays in Rust. Replaces any pending key. */
  createCsr(identity: string): string {
    return call(() => this.inner.createCsr(identity));
  }

  /** `chainPem`: leaf first, then intermediates. Throws CERT_MISMATCH if it does not match the pending key. */
  installCertificate(identity: string, chainPem: string, rootsPem: string): void {
    call(() => this.inner.installCertificate(identity, chainPem, rootsPem));
  }

  /**
   * Replaces the certificate revocation lists every HBONE handshake checks peers against, both ways (CRL_PATH's
   * PEM; "" for none). Throws INVALID_CRL, keeping the lists in force, when the PEM does not parse. Returns how many
   * lists are in force.
   */
  setCrls(pem: string): number {
    return call(() => this.inner.setCrls(pem));
  }

  /** Frees an identity's key and certificate in the dataplane; true if it had one. */
  forgetIdentity(identity: string): boolean {
    return call(() => this.inner.forgetIdentity(identity));
  }

  /**
   * Certificates on demand: resolves with the identities the dataplane's handshakes are waiting for, once there is at
   * least one; an empty array once the dataplane drains or shuts down. Call again after each answer.
   */
  nextCertificateRequests(): Promise<string[]> {
    return callAsync(() => this.inner.nextCertificateRequests());
  }

  /** Binds the workload's listeners; rejects with BIND_FAILED. Resolves the actually bound addresses. */
  async addLocalWorkload(spec: LocalWorkloadSpec): Promise<BoundListeners> {
    const json = await callAsync(() => this.inner.addLocalWorkload(JSON.stringify(spec)));
    return JSON.parse(json) as BoundListeners;
  }

  removeLocalWorkload(uid: string): Promise<void> {
    return callAsync(() => this.inner.removeLocalWorkload(uid));
  }

  /**
   * The counters' snapshot. `trafficText`: the traffic counters come as OpenMetrics text (`traffic`, what a scrape
   * serves) instead of JSON rows (`connections`, empty then).
   */
  metrics(opts: { trafficText: boolean } = { trafficText: false }): MetricsSnapshot {
    return JSON.parse(call(() => this.inner.metrics(opts.trafficText))) as MetricsSnapshot;
  }

  /** Shared mode: start the in-pod workload manager (the ZDS client of istio-cni). */
  startInpod(cfg: InPodConfig): void {
    call(() => this.inner.startInpod(JSON.stringify(cfg)));
  }

  /** Dedicated mode: capture listeners for one workload in the daemon's own network namespace. */
  startDedicated(spec: DedicatedSpec): Promise<void> {
    return callAsync(() => this.inner.startDedicated(JSON.stringify(spec)));
  }

  /** The endpoints outlier detection tracks, by uid (config_dump's `outliers`). */
  outliers(): OutlierEndpoint[] {
    return JSON.parse(call(() => this.inner.outliers())) as OutlierEndpoint[];
  }

  /** Shared mode: the daemon's own inbound HBONE listener (ztunnel's self-proxy); resolves the address bound. */
  startSelfInbound(spec: SelfInboundSpec): Promise<string> {
    return callAsync(() => this.inner.startSelfInbound(JSON.stringify(spec)));
  }

  /**
   * The in-pod manager's state; null when it is not running. With `connections: false` the pods' live connections
   * are left out (config_dump wants them; a readiness poll or a metric scrape must not pay O(connections)).
   */
  inpodState(opts: { connections: boolean } = { connections: true }): InPodState | null {
    return JSON.parse(call(() => this.inner.inpodState(opts.connections))) as InPodState | null;
  }

  /** The process's CPU profile over `seconds` at `frequency` Hz, pprof protobuf (admin /debug/pprof/profile). */
  cpuProfile(seconds: number, frequency: number): Promise<Uint8Array> {
    return callAsync(() => this.inner.cpuProfile(seconds, frequency));
  }

  /** Stops the CPU profile being taken, if any: its cpuProfile rejects within 100 ms. */
  cancelCpuProfile(): void {
    call(() => this.inner.cancelCpuProfile());
  }

  /** Turns the heap profile's sampling on or off; returns whether it is on (off drops what was recorded). */
  heapProfiling(activate: boolean): boolean {
    return call(() => this.inner.heapProfiling(activate));
  }

  /** The dataplane's live sampled allocations, pprof protobuf (admin /debug/pprof/heap); rejects while sampling is off. */
  heapProfile(): Promise<Uint8Array> {
    return callAsync(() => this.inner.heapProfile());
  }

  /** config_dump's `staticConfig` without its policies: the last applied local document's workloads and services. */
  localDump(): LocalDump {
    return JSON.parse(call(() => this.inner.localDump())) as LocalDump;
  }

  /** config_dump's `workloadState` in local mode: each workload served here, with its live connections by default. */
  localWorkloadState(opts: { connections: boolean } = { connections: true }): Record<string, InPodWorkload> {
    return JSON.parse(call(() => this.inner.localWorkloadState(opts.connections))) as Record<string, InPodWorkload>;
  }

  /** Explain the authorization decision for a hypothetical inbound connection (the enforcement code path). */
  authorize(request: AuthorizeRequest): AuthorizeExplanation {
    return JSON.parse(call(() => this.inner.authorize(JSON.stringify(request)))) as AuthorizeExplanation;
  }

  /**
   * The policy impact preview: what the candidate policies would do if applied (the live inbound connections they
   * would close, the recent denied attempts they would allow), judged by the enforcement code path on the dataplane's
   * runtime, without applying them. Rejects INVALID_STATE (a candidate the dataplane would refuse) or INVALID_SPEC.
   */
  async previewAuthz(request: AuthzPreviewRequest): Promise<AuthzPreview> {
    return JSON.parse(await callAsync(() => this.inner.previewAuthz(JSON.stringify(request)))) as AuthzPreview;
  }

  /**
   * The log levels in force for access events and the dataplane's other events: events below them are not built
   * (a filtered-out access log costs a connection nothing).
   */
  setEventLevels(access: LogLevel, dataplane: LogLevel, dns: LogLevel = dataplane): void {
    call(() => this.inner.setEventLevels(access, dataplane, dns));
  }

  /** Events queued since the last call, oldest first. */
  drainEvents(): NativeEvent[] {
    return JSON.parse(call(() => this.inner.drainEvents())) as NativeEvent[];
  }

  /**
   * Turns on the OTLP encoding of access records (native otlp.rs): from now on each `drainEvents()` also encodes its
   * access records as OTLP log records of this resource and scope, and queues them (at most `maxQueue`) for `takeOtlp`.
   */
  exportOtlp(resource: Readonly<Record<string, string | number | boolean>>, scope: string, maxQueue: number): void {
    call(() => this.inner.exportOtlp(JSON.stringify(resource), scope, maxQueue));
  }

  /**
   * Up to `max` queued access records as one OTLP ExportLogsServiceRequest (protobuf; null when none wait), and the
   * records dropped at the full queue since the last call.
   */
  takeOtlp(max: number): { body: Uint8Array | null; count: number; dropped: number } {
    const r = call(() => this.inner.takeOtlp(max));
    return { body: r.body ?? null, count: r.count, dropped: r.dropped };
  }

  certificates(): InstalledCertificate[] {
    return JSON.parse(call(() => this.inner.certificates())) as InstalledCertificate[];
  }

  listeners(): BoundListeners[] {
    return JSON.parse(call(() => this.inner.listeners())) as BoundListeners[];
  }

  /**
   * Predecessor: serve hand-overs on the Unix socket `path` (0600). `replace`: take the name from a daemon that is
   * leaving (one this daemon just tried to take over from); otherwise a socket someone serves is refused.
   */
  handoverListen(path: string, replace: boolean): void {
    call(() => this.inner.handoverListen(path, replace));
  }

  /** Predecessor: the next hand-over this daemon gave (or refused); null once it no longer listens. */
  async nextHandover(): Promise<HandoverReport | null> {
    const json = await callAsync(() => this.inner.nextHandover());
    return json === null || json === undefined ? null : (JSON.parse(json) as HandoverReport);
  }

  /**
   * Successor: take the established connections of the daemon serving `path` and carry them on. Call once this
   * daemon serves the same workloads, before it is ready. `found: false` when nobody serves `path`.
   */
  async handoverTake(path: string): Promise<HandoverReport> {
    return JSON.parse(await callAsync(() => this.inner.handoverTake(path))) as HandoverReport;
  }

  /**
   * Stop accepting, GOAWAY, wait up to `deadlineMs` for connections, close the rest. Idempotent. Resolves true
   * when every connection finished before the deadline (false: some were closed forcibly).
   */
  drain(deadlineMs: number): Promise<boolean> {
    return callAsync(() => this.inner.drain(deadlineMs));
  }

  /** Stops and joins the runtime. Call after `drain`. */
  shutdown(): void {
    call(() => this.inner.shutdown());
  }
}

export function openDataplane(cfg: DataplaneConfig): Dataplane {
  return Dataplane.open(cfg);
}

/**
 * The built-in CA (LOCAL_CA_DIR): a root key and certificate kept on disk, shared by the daemons of one host; or
 * (FAKE_CA alone) a root made in memory for this process.
 */
export class LocalCa {
  private constructor(private readonly inner: B.LocalCa) {}

  /** Loads or creates `<dir>/root-cert.pem` and `<dir>/root-key.pem`. Throws CA_ERROR. */
  static open(dir: string, trustDomain: string): LocalCa {
    const { LocalCa: Native } = load();
    return new LocalCa(call(() => Native.open(dir, trustDomain)));
  }

  /** A root made in memory for this process only; its key is never written. Throws CA_ERROR. */
  static ephemeral(trustDomain: string): LocalCa {
    const { LocalCa: Native } = load();
    return new LocalCa(call(() => Native.ephemeral(trustDomain)));
  }

  rootPem(): string {
    return call(() => this.inner.rootPem());
  }

  /** The chain PEM (leaf then root). Throws CSR_INVALID when the CSR does not verify or names another identity. */
  sign(csrPem: string, identity: string, ttlSeconds: number): string {
    return call(() => this.inner.sign(csrPem, identity, ttlSeconds));
  }
}

export function nativeVersion(): NativeVersion {
  return JSON.parse(call(() => load().version())) as NativeVersion;
}
