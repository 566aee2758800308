//! How a batch of mesh state reaches the state: the dataplane's side of a state change. What can be judged without
//! the lock (JSON deltas parsed and validated, a WDS response decoded and validated resource by resource: the mesh
//! crate's work) is judged first; then, under the lock, the batch is completed from what is held, what changes
//! nothing is dropped, the re-evaluation scope is computed and the change applied; the outlier detector forgets what
//! istiod said anew, and the live connections the change can affect are judged again after (proxy/reevaluation.rs).

use crate::{alloc, proxy, state, Dataplane, DataplaneError, State, StateDelta};

/// A WDS batch this large (a first push) leaves enough freed heap behind to be worth giving back.
const LARGE_BATCH: usize = 1000;
/// Removals applied per hold of the state's write lock in a large batch (`apply_valid`): a few ms in a release build.
const REMOVAL_CHUNK: usize = 4_096;

impl Dataplane {
    /// Apply a batched state delta (JSON). Validation happens before the lock is taken; a bad delta changes
    /// nothing. Returns what changed, as the control side reads it (`AppliedOut`).
    pub fn apply_state_json(&self, json: &str) -> Result<String, DataplaneError> {
        let delta = StateDelta::from_json(json.as_bytes())?;
        let applied = self.apply_state(delta)?;
        Ok(self.applied_json(&applied, Vec::new(), Vec::new()))
    }

    /// Several JSON deltas (the chunks of one local config load), applied as one: all are parsed and validated
    /// before any applies, so a bad chunk changes nothing (no chunk is left half-applied to roll back).
    pub fn apply_state_batches(&self, chunks: &[Vec<u8>]) -> Result<String, DataplaneError> {
        let mut merged = state::ValidDelta::default();
        for chunk in chunks {
            let delta = StateDelta::from_json(chunk)?;
            merged.absorb(delta.validate()?);
        }
        let applied = self.apply_valid(merged, |_, _| (), |_, ()| ());
        let out = self.applied_json(&applied, Vec::new(), Vec::new());
        state::intern::sweep();
        alloc::release_free_heap();
        Ok(out)
    }

    /// Applies a local config document held by `state::local::stash` (ticket `id`), with its policies (compiled by
    /// the control side: JSON deltas carrying only policies, every policy of the document), as one change: what the
    /// document has is upserted (what equals what is held changes nothing), and what the last applied local document
    /// had and this one lacks is removed; sources other than the local document (xDS) are not touched. All or
    /// nothing: a bad policy chunk, or an unknown ticket, changes nothing (the document is dropped either way).
    pub fn apply_local(&self, id: u32, policy_chunks: &[Vec<u8>]) -> Result<String, DataplaneError> {
        let doc = state::local::take(id)
            .ok_or_else(|| DataplaneError::Spec(format!("no local config document is held under ticket {id}")))?;
        let mut delta = state::ValidDelta::default();
        for chunk in policy_chunks {
            let d = StateDelta::from_json(chunk)?;
            if d.full || !d.workloads.is_empty() || !d.services.is_empty() || !d.removed_policies.is_empty() {
                return Err(DataplaneError::Spec("a local policy chunk carries more than policies".into()));
            }
            delta.policies.extend(d.validate()?.policies);
        }
        let keys = state::local::LocalKeys::of(&doc, &delta.policies);
        delta.workloads = doc.workloads;
        delta.services = doc.services;
        let applied = self.apply_valid(
            delta,
            move |st, d| {
                let gone = st.local_removals(&keys);
                (d.removed_workloads, d.removed_services, d.removed_policies) =
                    (gone.workloads, gone.services, gone.policies);
                keys
            },
            |st, keys| st.local_record(keys),
        );
        let out = self.applied_json(&applied, Vec::new(), Vec::new());
        state::intern::sweep();
        alloc::release_free_heap();
        Ok(out)
    }

    /// Authorization is continuous: the live connections the change can affect are judged again by the
    /// re-evaluation task (proxy/reevaluation.rs), after this returns.
    pub fn apply_state(&self, delta: StateDelta) -> Result<state::Applied, DataplaneError> {
        let valid = delta.validate()?;
        Ok(self.apply_valid(valid, |_, _| (), |_, ()| ()))
    }

    /// Under the state lock: `before` (completes the delta from what is held), drop what changes nothing, compute
    /// the re-evaluation scope, apply, then `after` (more bookkeeping under the same lock). Past `REMOVAL_CHUNK`
    /// removals (of keys the batch does not upsert), those are applied first, that many at a time, the lock yielded
    /// to waiting readers between parts: a tunnel's set-up never waits for a whole mass removal (issue #29: removing
    /// 100k services held it for the whole batch). Readers may see some of the removals before the rest, as they
    /// would if istiod had sent them in several responses; batches are applied one at a time (one caller).
    fn apply_valid<T>(
        &self,
        mut valid: state::ValidDelta,
        before: impl FnOnce(&State, &mut state::ValidDelta) -> T,
        after: impl FnOnce(&mut State, T),
    ) -> state::Applied {
        let (scope, applied) = {
            // Reading what the batch changes excludes other writers only; readers (set-ups) go on until it applies.
            let state = self.pi.state.upgradable_read();
            let kept = before(&state, &mut valid);
            state.drop_unchanged(&mut valid);
            let parts = if !valid.full && valid.removed_workloads.len() + valid.removed_services.len() > REMOVAL_CHUNK {
                valid.take_removal_chunks(REMOVAL_CHUNK)
            } else {
                Vec::new()
            };
            let mut state = parking_lot::RwLockUpgradableReadGuard::upgrade(state);
            // What istiod says anew of an endpoint ends its ejection: healthy again (a new pod, a new status), or gone.
            if !self.pi.outliers.is_idle() {
                let healthy = valid.workloads.iter().filter(|w| w.status == state::WorkloadStatus::Healthy);
                for uid in healthy.map(|w| &*w.uid).chain(valid.removed_workloads.iter().map(String::as_str)) {
                    self.pi.outliers.forget(uid);
                }
            }
            let mut applied = state::Applied::default();
            for part in parts {
                let scope = proxy::reevaluation::Scope::of_change(&state, &part);
                applied.merge(state.apply_valid(part));
                self.reevaluator.submit(scope);
                parking_lot::RwLockWriteGuard::bump(&mut state);
            }
            let scope = proxy::reevaluation::Scope::of_change(&state, &valid);
            applied.merge(state.apply_valid(valid));
            after(&mut state, kept);
            (scope, applied)
        };
        self.pi.state_changed.notify_waiters();
        self.reevaluator.submit(scope);
        applied
    }

    /// One WDS response's Address resources (each an encoded envoy `Resource`, packed by `wds::unpack`'s rule) and
    /// removed names. Each resource is judged alone: a bad one is rejected with its reason (the control side NACKs
    /// it, and its previous version keeps serving) while the good ones apply. Decoding and validation happen before
    /// the lock is taken.
    pub fn apply_addresses(&self, packed: &[u8], removed: Vec<String>) -> Result<String, DataplaneError> {
        let state::wds::Judged { delta, names, accepted, rejected, resources } =
            state::wds::judge(packed).map_err(DataplaneError::Spec)?;
        // The removals the names imply are read from the same locked state the batch applies to.
        let gone = &removed;
        let applied = self.apply_valid(
            delta,
            move |st, d| {
                (d.removed_workloads, d.removed_services) = st.wds_removals(&names, gone);
                names
            },
            |st, names| st.wds_record(names, gone),
        );
        let out = self.applied_json(&applied, accepted, rejected);
        if resources >= LARGE_BATCH {
            state::intern::sweep();
            alloc::release_free_heap();
        }
        Ok(out)
    }

    fn applied_json(&self, applied: &state::Applied, accepted: Vec<(String, String)>, rejected: Vec<String>) -> String {
        let (counts, missing) = {
            let st = self.pi.state.read();
            ([st.workload_count(), st.service_count(), st.policy_count()], st.missing_references())
        };
        let out = state::dump::applied(applied, &self.pi.cfg.node_name, accepted, rejected, counts, missing);
        serde_json::to_string(&out).expect("the outcome serializes")
    }
}
