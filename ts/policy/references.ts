// The WORKLOAD_SELECTOR policies that workloads name but that are not known (yet): each such workload denies every
// inbound connection until the policy arrives (fail closed, README "Authorization"). The daemon logs each reference
// as it becomes missing and exports how many there are (ztunnel_node_authorization_missing_policies).
//
// Invariant: `update` costs O(the change + the references to the policies it changed), never O(all workloads). A
// large state arrives in many chunks (ts/state/chunks.ts); a full scan per chunk made a 100k-workload load
// quadratic.

export interface MissingReference {
  uid: string;
  policy: string;
}

export class PolicyReferences {
  /** uid -> the policy keys it names (only workloads that name any). */
  private readonly byWorkload = new Map<string, readonly string[]>();
  /** policy key -> the uids naming it. */
  private readonly byPolicy = new Map<string, Set<string>>();
  /** "uid\npolicy" of the references that do not resolve. */
  private readonly missing = new Set<string>();

  constructor(private readonly known: (policyKey: string) => boolean) {}

  /** How many (workload, policy) references do not resolve. */
  get size(): number {
    return this.missing.size;
  }

  /**
   * Follows one applied change: the workloads whose entry changed (`after` undefined: removed) and the policy keys
   * that were upserted or removed. Returns the references that became missing with it.
   */
  update(
    workloads: Iterable<{ uid: string; after: { authorizationPolicies: readonly string[] } | undefined }>,
    policies: Iterable<string>,
  ): MissingReference[] {
    // Pairs that were missing before this change (and were taken out to be re-judged), and pairs added by it.
    const before = new Set<string>();
    const added = new Set<string>();
    const add = (pair: string) => {
      this.missing.add(pair);
      added.add(pair);
    };
    for (const w of workloads) {
      for (const policy of this.byWorkload.get(w.uid) ?? []) {
        const pair = `${w.uid}\n${policy}`;
        if (this.missing.delete(pair)) before.add(pair);
        const uids = this.byPolicy.get(policy);
        uids?.delete(w.uid);
        if (uids?.size === 0) this.byPolicy.delete(policy);
      }
      const names = [...new Set(w.after?.authorizationPolicies ?? [])];
      if (names.length === 0) {
        this.byWorkload.delete(w.uid);
        continue;
      }
      this.byWorkload.set(w.uid, names);
      for (const policy of names) {
        let uids = this.byPolicy.get(policy);
        if (uids === undefined) this.byPolicy.set(policy, (uids = new Set()));
        uids.add(w.uid);
        if (!this.known(policy)) add(`${w.uid}\n${policy}`);
      }
    }
    for (const policy of new Set(policies)) {
      const present = this.known(policy);
      for (const uid of this.byPolicy.get(policy) ?? []) {
        const pair = `${uid}\n${policy}`;
        if (present) {
          if (this.missing.delete(pair)) before.add(pair);
        } else if (!this.missing.has(pair)) {
          add(pair);
        }
      }
    }
    const now: MissingReference[] = [];
    for (const pair of added) {
      if (before.has(pair) || !this.missing.has(pair)) continue;
      const [uid, policy] = pair.split('\n') as [string, string];
      now.push({ uid, policy });
    }
    return now;
  }
}
