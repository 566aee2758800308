//! The napi-rs facade over `dataplane`. Nothing but forwarding: every call takes or returns one JSON string or a
//! PEM, so the boundary stays coarse (one call per state batch, per certificate, per scrape; never per connection).
//! Errors cross as `Error` whose message starts with a stable code (`INVALID_STATE:`, `BIND_FAILED:` ...).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use napi::bindgen_prelude::*;
use napi_derive::napi;

use dataplane::ErrorCode;

/// The system allocator, sampled while the heap profile is on (native host/src/heap_profile.rs); otherwise one atomic load more
/// per allocation and free.
#[global_allocator]
static ALLOCATOR: dataplane::heap_profile::Sampling = dataplane::heap_profile::Sampling;

fn err(e: impl std::fmt::Display) -> Error {
    Error::new(Status::GenericFailure, e.to_string())
}

/// One `takeOtlp` answer.
#[napi(object)]
pub struct OtlpBatch {
    pub body: Option<Buffer>,
    pub count: u32,
    pub dropped: f64,
}

#[napi]
pub struct Dataplane {
    inner: Arc<dataplane::Dataplane>,
}

#[napi]
impl Dataplane {
    #[napi(constructor)]
    pub fn new(config_json: String) -> Result<Self> {
        Ok(Dataplane { inner: Arc::new(dataplane::Dataplane::from_json(&config_json).map_err(err)?) })
    }

    /// A state delta (JSON); resolves what changed (`AppliedOut` JSON: docs/native-api.md).
    #[napi]
    pub fn apply_state(&self, delta_json: String) -> Result<String> {
        self.inner.apply_state_json(&delta_json).map_err(err)
    }

    /// The chunks of one large delta (UTF-8 JSON each), validated whole then applied as one, off the JS thread.
    #[napi]
    pub async fn apply_state_batches(&self, chunks: Vec<Uint8Array>) -> Result<String> {
        let chunks: Vec<Vec<u8>> = chunks.iter().map(|c| c.to_vec()).collect();
        let inner = self.inner.clone();
        inner
            .handle()
            .clone()
            .spawn_blocking(move || inner.apply_state_batches(&chunks))
            .await
            .map_err(err)?
            .map_err(err)
    }

    /// Applies the local config document held under `ticket` (`localPrepare`) with the
    /// compiled policy part of its change (JSON deltas of policies only), as one change, off the JS thread.
    #[napi]
    pub async fn apply_local(&self, ticket: u32, policy_chunks: Vec<Uint8Array>) -> Result<String> {
        let chunks: Vec<Vec<u8>> = policy_chunks.iter().map(|c| c.to_vec()).collect();
        let inner = self.inner.clone();
        inner
            .handle()
            .clone()
            .spawn_blocking(move || inner.apply_local(ticket, &chunks))
            .await
            .map_err(err)?
            .map_err(err)
    }

    /// One WDS response's Address resources (encoded envoy Resources, each prefixed by its u32 LE length) and
    /// removed names, decoded and applied off the JS thread; resolves `AppliedOut` JSON with `accepted`/`rejected`.
    #[napi]
    pub async fn apply_addresses(&self, packed: Uint8Array, removed: Vec<String>) -> Result<String> {
        let packed = packed.to_vec();
        let inner = self.inner.clone();
        inner
            .handle()
            .clone()
            .spawn_blocking(move || inner.apply_addresses(&packed, removed))
            .await
            .map_err(err)?
            .map_err(err)
    }

    /// `applyAddresses` on the calling thread: for a small response (one update), where the hop to a blocking-pool
    /// thread and back costs more than the work.
    #[napi]
    pub fn apply_addresses_now(&self, packed: Uint8Array, removed: Vec<String>) -> Result<String> {
        self.inner.apply_addresses(&packed, removed).map_err(err)
    }

    /// config_dump's `staticConfig` without its policies, as JSON: the last applied local document's workloads and
    /// services as parsed.
    #[napi]
    pub fn local_dump(&self) -> String {
        self.inner.local_dump_json()
    }

    /// config_dump's `{ workloads, services, stagedServices }` as JSON, rendered from the dataplane's state.
    #[napi]
    pub fn mesh_dump(&self) -> String {
        self.inner.mesh_dump_json()
    }

    #[napi]
    pub fn create_csr(&self, identity: String) -> Result<String> {
        self.inner.create_csr(&identity).map_err(err)
    }

    #[napi]
    pub fn install_certificate(&self, identity: String, chain_pem: String, roots_pem: String) -> Result<()> {
        self.inner.install_certificate(&identity, &chain_pem, &roots_pem).map_err(err)
    }

    /// Replaces the certificate revocation lists (CRL_PATH's PEM; empty: none); returns how many are in force.
    #[napi]
    pub fn set_crls(&self, pem: String) -> Result<u32> {
        self.inner.set_crls(&pem).map(|n| n as u32).map_err(err)
    }

    /// Free an identity's key and certificate; true if there was one.
    #[napi]
    pub fn forget_identity(&self, identity: String) -> Result<bool> {
        self.inner.forget_identity(&identity).map_err(err)
    }

    /// Certificates on demand: resolves with the identities handshakes are waiting for, once there is at least one
    /// (an empty array when the dataplane drains or shuts down). The control side calls it again after each answer.
    #[napi]
    pub async fn next_certificate_requests(&self) -> Result<Vec<String>> {
        let inner = self.inner.clone();
        inner.handle().clone().spawn(async move { inner.next_certificate_requests().await }).await.map_err(err)
    }

    #[napi]
    pub async fn add_local_workload(&self, spec_json: String) -> Result<String> {
        let spec: dataplane::LocalWorkloadSpec =
            serde_json::from_str(&spec_json).map_err(|e| err(format!("{}: {e}", ErrorCode::InvalidSpec)))?;
        let inner = self.inner.clone();
        let bound = inner
            .handle()
            .clone()
            .spawn(async move { inner.add_local_workload(spec).await })
            .await
            .map_err(err)?
            .map_err(err)?;
        serde_json::to_string(&bound).map_err(err)
    }

    #[napi]
    pub async fn remove_local_workload(&self, uid: String) -> Result<()> {
        let inner = self.inner.clone();
        inner.handle().clone().spawn(async move { inner.remove_local_workload(&uid).await }).await.map_err(err)?;
        Ok(())
    }

    /// Explain the authorization decision for `{ srcIdentity?, srcIp, dst }` (admin `/debug/authorize`).
    #[napi]
    pub fn authorize(&self, request_json: String) -> Result<String> {
        self.inner.authorize_json(&request_json).map_err(err)
    }

    /// The policy impact preview of candidate policies (`AuthzPreviewRequest` JSON; admin `POST /debug/authz/preview`):
    /// resolves `AuthzPreview` JSON. Runs on the dataplane's runtime, never applies anything.
    #[napi]
    pub async fn preview_authz(&self, request_json: String) -> Result<String> {
        let inner = self.inner.clone();
        inner
            .handle()
            .clone()
            .spawn(async move { inner.preview_authz_json(&request_json).await })
            .await
            .map_err(err)?
            .map_err(err)
    }

    /// The process's CPU profile over `seconds` at `frequency` Hz, in the pprof protobuf format (admin
    /// `/debug/pprof/profile`; native host/src/profile.rs). Sampled on a blocking-pool thread; rejects `PROFILE:` when the
    /// bounds are wrong or a profile is already being taken.
    #[napi]
    pub async fn cpu_profile(&self, seconds: u32, frequency: u32) -> Result<Buffer> {
        let frequency = i32::try_from(frequency).unwrap_or(i32::MAX);
        self.inner
            .handle()
            .spawn_blocking(move || dataplane::profile::cpu_profile(u64::from(seconds), frequency))
            .await
            .map_err(err)?
            .map(Buffer::from)
            .map_err(|e| err(format!("{}: {e}", ErrorCode::Profile)))
    }

    /// Stops the CPU profile being taken, if any (its requester went away): its `cpuProfile` rejects with
    /// `PROFILE: the profile was cancelled` within 100 ms.
    #[napi]
    pub fn cancel_cpu_profile(&self) {
        dataplane::profile::cancel_cpu_profile();
    }

    /// Turns the heap profile's sampling on or off (admin `/debug/pprof/heap/profiling?activate=`); returns whether it
    /// is on. Off drops what was recorded.
    #[napi]
    pub fn heap_profiling(&self, activate: bool) -> bool {
        dataplane::heap_profile::activate(activate)
    }

    /// The live sampled allocations as a pprof protobuf profile (admin `/debug/pprof/heap`); rejects `PROFILE:` when
    /// the sampling is off. Symbolized on a blocking-pool thread.
    #[napi]
    pub async fn heap_profile(&self) -> Result<Buffer> {
        self.inner
            .handle()
            .spawn_blocking(dataplane::heap_profile::profile)
            .await
            .map_err(err)?
            .map(Buffer::from)
            .map_err(|e| err(format!("{}: {e}", ErrorCode::Profile)))
    }

    /// Shared mode: start the in-pod workload manager (ZDS client). `{ uds, mark, reusePort, origSrc? }`.
    #[napi]
    pub fn start_inpod(&self, config_json: String) -> Result<()> {
        self.inner.start_inpod(&config_json).map_err(err)
    }

    /// Dedicated mode: `{ namespace, name, serviceAccount, mark, origSrc? }`.
    #[napi]
    pub async fn start_dedicated(&self, spec_json: String) -> Result<()> {
        let spec: dataplane::DedicatedSpec =
            serde_json::from_str(&spec_json).map_err(|e| err(format!("{}: {e}", ErrorCode::InvalidSpec)))?;
        let inner = self.inner.clone();
        inner.handle().clone().spawn(async move { inner.start_dedicated(spec).await }).await.map_err(err)?.map_err(err)
    }

    /// Shared mode: the daemon's own inbound HBONE listener (`{ namespace, name, serviceAccount, reachablePorts,
    /// reusePort }`); resolves the address bound.
    #[napi]
    pub async fn start_self_inbound(&self, spec_json: String) -> Result<String> {
        let spec: dataplane::proxy::self_inbound::SelfInboundSpec =
            serde_json::from_str(&spec_json).map_err(|e| err(format!("{}: {e}", ErrorCode::InvalidSpec)))?;
        let inner = self.inner.clone();
        let addr = inner
            .handle()
            .clone()
            .spawn(async move { inner.start_self_inbound(spec) })
            .await
            .map_err(err)?
            .map_err(err)?;
        Ok(addr.to_string())
    }

    /// The in-pod manager's state as JSON (`null` when not running). `connections` (default true): list each pod's
    /// live connections, for config_dump; polls and metric scrapes pass false (O(pods), not O(connections)).
    #[napi]
    pub fn inpod_state(&self, connections: Option<bool>) -> String {
        self.inner.inpod_state_json(connections.unwrap_or(true))
    }

    /// config_dump's `workloadState` in local mode (uid → the in-pod manager's per-workload shape).
    /// `connections` (default true) as for `inpodState`.
    #[napi]
    pub fn local_workload_state(&self, connections: Option<bool>) -> String {
        self.inner.local_state_json(connections.unwrap_or(true))
    }

    /// The counters' snapshot as JSON. `traffic_text` (default false): the traffic counters as OpenMetrics text in
    /// `traffic` instead of rows in `connections` (the /metrics scrape).
    #[napi]
    pub fn metrics(&self, traffic_text: Option<bool>) -> String {
        self.inner.metrics_json(traffic_text.unwrap_or(false))
    }

    /// Log filter levels ("trace".."error", "off") for access events, the DNS proxy's records and the dataplane's
    /// other events.
    #[napi]
    pub fn set_event_levels(&self, access: String, dataplane: String, dns: String) -> Result<()> {
        self.inner.set_event_levels(&access, &dataplane, &dns).map_err(err)
    }

    #[napi]
    pub fn drain_events(&self) -> String {
        self.inner.drain_events_json()
    }

    /// Turns on the OTLP encoding of access records (native otlp.rs): each `drainEvents` also encodes its access
    /// records and queues them (at most `maxQueue`) for `takeOtlp`.
    #[napi]
    pub fn export_otlp(&self, resource_json: String, scope: String, max_queue: u32) -> Result<()> {
        self.inner.export_otlp(&resource_json, &scope, max_queue as usize).map_err(err)
    }

    /// Up to `max` queued access records as one OTLP ExportLogsServiceRequest (protobuf; `body` null when none wait),
    /// with the records dropped at the full queue since the last call.
    #[napi]
    pub fn take_otlp(&self, max: u32) -> OtlpBatch {
        let (batch, dropped) = self.inner.take_otlp(max as usize);
        OtlpBatch {
            count: batch.as_ref().map_or(0, |b| b.count as u32),
            body: batch.map(|b| b.body.into()),
            dropped: dropped as f64,
        }
    }

    /// The endpoints outlier detection tracks: JSON `OutlierEndpoint[]` (config_dump's `outliers`).
    #[napi]
    pub fn outliers(&self) -> String {
        self.inner.outliers_json()
    }

    #[napi]
    pub fn certificates(&self) -> String {
        self.inner.certificates_json()
    }

    #[napi]
    pub fn listeners(&self) -> Result<String> {
        serde_json::to_string(&self.inner.listeners()).map_err(err)
    }

    /// Predecessor: serve hand-overs on the Unix socket at `path` (0600; a stale one is replaced, a served one is
    /// refused unless `replace`: the daemon this one just took over from is leaving). A successor that speaks this version makes the daemon stop accepting and takes what it can.
    #[napi]
    pub fn handover_listen(&self, path: String, replace: bool) -> Result<()> {
        self.inner.handover_listen(&path, replace).map_err(err)
    }

    /// Predecessor: resolves with the next hand-over this daemon gave (`HandoverReport` JSON), `null` when it does
    /// not listen.
    #[napi]
    pub async fn next_handover(&self) -> Result<Option<String>> {
        let inner = self.inner.clone();
        let report = inner.handle().clone().spawn(async move { inner.next_handover().await }).await.map_err(err)?;
        report.map(|r| serde_json::to_string(&r).map_err(err)).transpose()
    }

    /// Successor: take the connections of the daemon serving `path` and carry them on (`HandoverReport` JSON;
    /// `found: false` when nobody serves it).
    #[napi]
    pub async fn handover_take(&self, path: String) -> Result<String> {
        let inner = self.inner.clone();
        let report =
            inner.handle().clone().spawn(async move { inner.handover_take(&path).await }).await.map_err(err)?;
        serde_json::to_string(&report).map_err(err)
    }

    /// Graceful drain. Resolves true if every connection finished before the deadline.
    #[napi]
    pub async fn drain(&self, deadline_ms: u32) -> Result<bool> {
        let inner = self.inner.clone();
        inner
            .handle()
            .clone()
            .spawn(async move { inner.drain(Duration::from_millis(u64::from(deadline_ms))).await })
            .await
            .map_err(err)
    }

    /// Stop and join the runtime. Call after `drain`; the object is unusable afterwards.
    #[napi]
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }
}

#[napi]
pub struct LocalCa {
    inner: dataplane::ca::LocalCa,
}

#[napi]
impl LocalCa {
    #[napi(factory)]
    pub fn open(dir: String, trust_domain: String) -> Result<Self> {
        Ok(LocalCa { inner: dataplane::ca::LocalCa::open(Path::new(&dir), &trust_domain).map_err(err)? })
    }

    /// A root made in memory for this process (FAKE_CA without LOCAL_CA_DIR); its key is never written.
    #[napi(factory)]
    pub fn ephemeral(trust_domain: String) -> Result<Self> {
        Ok(LocalCa { inner: dataplane::ca::LocalCa::ephemeral(&trust_domain).map_err(err)? })
    }

    #[napi]
    pub fn root_pem(&self) -> String {
        self.inner.root_pem().to_string()
    }

    #[napi]
    pub fn sign(&self, csr_pem: String, identity: String, ttl_seconds: u32) -> Result<String> {
        self.inner.sign(&csr_pem, &identity, Duration::from_secs(u64::from(ttl_seconds))).map_err(err)
    }
}

/// One istio.workload.Address body decoded and validated as the dataplane does it for WDS: JSON `{ workload }` or
/// `{ service }` in the control side's shape; throws the NACK reason.
#[napi]
pub fn decode_address(body: Uint8Array) -> Result<String> {
    dataplane::state::wds::decode_address_json(&body).map_err(err)
}

/// YAML text (the local config file) → the same document as JSON text; throws `line L, column C: invalid YAML: ...`.
#[napi]
pub fn yaml_to_json(text: String) -> Result<String> {
    dataplane::yaml::yaml_to_json(&text).map_err(err)
}

/// The local config read (mesh/src/state/local.rs), on the calling thread (the loader's worker): the YAML read into
/// validated workloads and services, held for `Dataplane.applyLocal`. JSON
/// `{ "ticket": n, "workloads": n, "services": n, "policies": [...] }` (the policies as written, for the control side's
/// schema), or `{ "problems": ["<path>: <problem>", ...], "total": n }` when the document is refused.
#[napi]
pub fn local_prepare(text: Uint8Array) -> Result<String> {
    let Ok(text) = std::str::from_utf8(&text) else {
        return Ok(r#"{"problems":["the file is not UTF-8 text"],"total":1}"#.into());
    };
    Ok(match dataplane::state::local::LocalDocument::from_yaml(text) {
        Ok(mut doc) => {
            let (w, s) = (doc.workloads.len(), doc.services.len());
            let policies = std::mem::take(&mut doc.policies_json);
            let ticket = dataplane::state::local::stash(doc);
            format!(r#"{{"ticket":{ticket},"workloads":{w},"services":{s},"policies":{policies}}}"#)
        }
        Err(r) => serde_json::json!({ "problems": r.problems, "total": r.total }).to_string(),
    })
}

/// A held document's records, taken (it will not be applied): JSON `{ "workloads": [...], "services": [...] }` in the
/// form a delta carries them (`parseLocalConfig`, for tools and tests).
#[napi]
pub fn local_records(ticket: u32) -> Result<String> {
    let doc = dataplane::state::local::take(ticket).ok_or_else(|| err("no such local document"))?;
    let workloads: Vec<_> = doc.workloads.iter().map(dataplane::state::dump::workload).collect();
    let workloads = serde_json::to_string(&workloads).map_err(err)?;
    let services = serde_json::to_string(&doc.services).map_err(err)?;
    Ok(format!(r#"{{"workloads":{workloads},"services":{services}}}"#))
}

/// Drops a held document that will not be applied.
#[napi]
pub fn local_discard(ticket: u32) {
    dataplane::state::local::take(ticket);
}

/// Gives the allocator's free heap back to the kernel (malloc_trim). The control side calls it after collecting the
/// garbage of a large batch: the batch's answer, its JSON and the JS buffers are freed only after the dataplane has
/// returned, so the trim the dataplane does at the end of a batch cannot reach them (33 MiB resident at 100k).
#[napi]
pub fn release_free_heap() {
    dataplane::alloc::release_free_heap();
}

/// Releases the resident pages of the process's executable file mappings that hold only the file's bytes (native
/// footprint.rs): what startup ran once leaves the RSS, what runs again faults back in. JSON `ColdCodeReleased`.
#[napi]
pub fn release_cold_code() -> Result<String> {
    let released = dataplane::footprint::release_cold_code().map_err(err)?;
    serde_json::to_string(&released).map_err(err)
}

/// JSON `{ version, cryptoProvider, buildProfile }` of the native build.
#[napi]
pub fn version() -> String {
    dataplane::version_json()
}
