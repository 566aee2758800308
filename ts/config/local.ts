// The local config file (LOCAL_XDS_PATH / LOCAL_XDS): workloads, services and policies in ztunnel's camelCase YAML.
// Validation is strict, like ztunnel's `deny_unknown_fields`: a typo must fail loudly, not turn into a silently
// missing field. Every error names the file, the path inside the document (`workloads[1].workloadIps[0]`) and the
// problem. One schema per part of the document: its workloads and services are read by the dataplane, whose record
// types (native/mesh/src/state/model.rs, `Workload` and `Service`) are their schema (native/mesh/src/state/local.rs);
// its policies, which this side compiles (policy/compile.ts), are judged here (`policySchema`).
import { readFile } from 'node:fs/promises';
import { isIP } from 'node:net';
import { z } from 'zod';
import { LocalConfigError, ZtunnelError } from '../errors.js';
import { localDiscard, localPrepare, localRecords, yamlToJson, type PreparedLocal } from '../native/index.js';
import type { Policy, StateSnapshot, StringMatch } from '../state/model.js';
import { policyKey } from '../state/model.js';

export interface LocalConfig extends StateSnapshot {
  /** Where it came from: the file path, or "LOCAL_XDS" for inline YAML. */
  source: string;
}

// ---- field schemas -------------------------------------------------------------------------------------------

function isCidr(s: string): boolean {
  const slash = s.lastIndexOf('/');
  if (slash < 0) return false;
  const family = isIP(s.slice(0, slash));
  const len = s.slice(slash + 1);
  if (family === 0 || !/^\d{1,3}$/.test(len)) return false;
  return Number(len) <= (family === 4 ? 32 : 128);
}

const cidr = () =>
  z.string().refine(isCidr, { error: (iss) => `"${String(iss.input)}" is not a CIDR (e.g. 10.0.0.0/8)` });

const port = () =>
  z.number().int().min(1, { error: (iss) => `${String(iss.input)} is not a port (1-65535)` }).max(65535, {
    error: (iss) => `${String(iss.input)} is not a port (1-65535)`,
  });

/** Exactly one of Exact/Prefix/Suffix/Presence, as ztunnel's StringMatching serializes. */
const stringMatch = () =>
  z
    .strictObject({
      Exact: z.string().optional(),
      Prefix: z.string().optional(),
      Suffix: z.string().optional(),
      Presence: z.tuple([]).optional(),
    })
    .transform((m, ctx): StringMatch => {
      const set = (['Exact', 'Prefix', 'Suffix', 'Presence'] as const).filter((k) => m[k] !== undefined);
      if (set.length !== 1) {
        ctx.issues.push({ code: 'custom', input: m, message: 'expected exactly one of Exact, Prefix, Suffix, Presence' });
        return z.NEVER;
      }
      if (m.Exact !== undefined) return { Exact: m.Exact };
      if (m.Prefix !== undefined) return { Prefix: m.Prefix };
      if (m.Suffix !== undefined) return { Suffix: m.Suffix };
      return { Presence: [] };
    });

const serviceAccountMatch = () => z.strictObject({ namespace: z.string(), serviceAccount: z.string() });

// ---- document schema -----------------------------------------------------------------------------------------

const matchSchema = z.strictObject({
  namespaces: z.array(stringMatch()).default([]),
  notNamespaces: z.array(stringMatch()).default([]),
  principals: z.array(stringMatch()).default([]),
  notPrincipals: z.array(stringMatch()).default([]),
  serviceAccounts: z.array(serviceAccountMatch()).default([]),
  notServiceAccounts: z.array(serviceAccountMatch()).default([]),
  sourceIps: z.array(cidr()).default([]),
  notSourceIps: z.array(cidr()).default([]),
  destinationIps: z.array(cidr()).default([]),
  notDestinationIps: z.array(cidr()).default([]),
  destinationPorts: z.array(port()).default([]),
  notDestinationPorts: z.array(port()).default([]),
});

const policySchema = z.strictObject({
  name: z.string().min(1, { error: 'must not be empty' }),
  // Global policies live under namespace "", as ztunnel stores them.
  namespace: z.string().default(''),
  scope: z.enum(['Global', 'Namespace', 'WorkloadSelector']),
  action: z.enum(['Allow', 'Deny']),
  dryRun: z.boolean().default(false),
  rules: z.array(z.array(z.array(matchSchema))).default([]),
});

/** A document's `policies` (its workloads and services are the dataplane's to judge). */
const policiesSchema = z
  .strictObject({ policies: z.array(policySchema).default([]) })
  .superRefine((doc, ctx) => {
    const seen = new Map<string, number>();
    doc.policies.forEach((p, i) => {
      const first = seen.get(policyKey(p));
      if (first === undefined) seen.set(policyKey(p), i);
      else ctx.addIssue({ code: 'custom', path: ['policies', i], message: `duplicate policy "${policyKey(p)}" (also policies[${first}])` });
    });
  });

/**
 * Candidate policies for the policy impact preview (admin `POST /debug/authz/preview`), in the forms a user has at
 * hand: one policy as the local config writes it, a list of them, or `{ policies, selects }` (`selects`: a new
 * WorkloadSelector policy's key → the uids of the workloads it is to select). The same policy schema as the file.
 */
const candidatesSchema = z
  .strictObject({
    policies: z.array(policySchema).min(1, { error: 'at least one policy is needed' }),
    selects: z.record(z.string(), z.array(z.string().min(1, { error: 'must not be empty' }))).default({}),
  })
  .superRefine((doc, ctx) => {
    const seen = new Map<string, number>();
    doc.policies.forEach((p, i) => {
      const first = seen.get(policyKey(p));
      if (first === undefined) seen.set(policyKey(p), i);
      else ctx.addIssue({ code: 'custom', path: ['policies', i], message: `duplicate policy "${policyKey(p)}" (also policies[${first}])` });
    });
  });

const _policyFits = (p: z.output<typeof policySchema>): Policy => p;

/** A policy as a local document writes it (the schema's input: a field with a default may be left out). */
export type LocalPolicyInput = z.input<typeof policySchema>;
/** One match of a policy's rule, as a local document writes it. */
export type LocalMatchInput = z.input<typeof matchSchema>;

// ---- error rendering -----------------------------------------------------------------------------------------

/** `workloads[1].workloadIps[0]`, `workloads[0].services["default/echo"]` */
export function formatPath(path: readonly PropertyKey[]): string {
  let out = '';
  for (const part of path) {
    if (typeof part === 'number') out += `[${part}]`;
    else if (typeof part === 'string' && /^[A-Za-z_$][\w$]*$/.test(part)) out += out === '' ? part : `.${part}`;
    else out += `[${JSON.stringify(String(part))}]`;
  }
  return out === '' ? '(document)' : out;
}

/**
 * At most this many problems are listed, the rest counted: a file with 100k errors is refused in a screenful, not
 * in 100k lines (issue 29).
 */
export const MAX_LISTED_PROBLEMS = 100;

/** The refusal of a document: each problem a line naming `source` and the path, at most MAX_LISTED_PROBLEMS. */
function refusal(issues: readonly z.core.$ZodIssue[], source: string): LocalConfigError {
  const out: string[] = [];
  let listed = 0;
  for (const issue of issues) {
    const lines = describeIssue(issue);
    if (listed > 0 && out.length + lines.length > MAX_LISTED_PROBLEMS) break;
    out.push(...lines.map((line) => `${source}: ${line}`));
    listed++;
  }
  return listing(out, issues.length - listed, source);
}

/** The LocalConfigError listing `lines`, then how many problems were not listed. */
function listing(lines: string[], more: number, source: string): LocalConfigError {
  if (more > 0) lines.push(`${source}: and ${more} more problem${more === 1 ? '' : 's'}`);
  return new LocalConfigError(lines.join('\n'));
}

function describeIssue(issue: z.core.$ZodIssue): string[] {
  switch (issue.code) {
    case 'unrecognized_keys':
      return issue.keys.map((k) => `${formatPath([...issue.path, k])}: unknown field "${k}"`);
    case 'invalid_key': {
      const inner = issue.issues[0]?.message ?? issue.message;
      return [`${formatPath(issue.path)}: invalid key: ${inner}`];
    }
    case 'invalid_value':
      return [`${formatPath(issue.path)}: ${JSON.stringify(issue.input)} is not one of ${issue.values.map(String).join('|')}`];
    case 'invalid_type':
      if (issue.input === undefined) return [`${formatPath(issue.path)}: missing required field`];
      return [`${formatPath(issue.path)}: expected ${issue.expected}, got ${describeValue(issue.input)}`];
    default:
      return [`${formatPath(issue.path)}: ${issue.message}`];
  }
}

function describeValue(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'a list';
  if (typeof v === 'object') return 'a mapping';
  return `${typeof v} ${JSON.stringify(v)}`;
}

// ---- entry points --------------------------------------------------------------------------------------------

/** The refusal of a document the dataplane read: its problems, each a line naming `source`. */
function refused(r: { problems: string[]; total: number }, source: string): LocalConfigError {
  return listing(r.problems.map((p) => `${source}: ${p}`), r.total - r.problems.length, source);
}

/**
 * One document read by the dataplane and its policies judged here: the held document's ticket, or a LocalConfigError
 * naming `source`, the path and the problem (the ticket is then already dropped).
 */
export function prepareLocal(text: Uint8Array, source: string): Extract<PreparedLocal, { ticket: number }> & { compiled: Policy[] } {
  const prepared = localPrepare(text);
  if ('problems' in prepared) throw refused(prepared, source);
  try {
    return { ...prepared, compiled: parseLocalPolicies(prepared.policies, source) };
  } catch (err) {
    localDiscard(prepared.ticket);
    throw err;
  }
}

/** Parses and validates one document (tools and tests: nothing is applied). `source` names it in errors. */
export function parseLocalConfig(text: string, source: string): LocalConfig {
  const prepared = prepareLocal(Buffer.from(text, 'utf8'), source);
  const { workloads, services } = localRecords(prepared.ticket);
  return { workloads, services, policies: prepared.compiled, source };
}

/** The policies of a document, validated by the policy schema (paths as in the whole document: `policies[0]...`). */
export function parseLocalPolicies(policies: unknown[], source: string): Policy[] {
  const parsed = policiesSchema.safeParse({ policies }, { reportInput: true });
  if (!parsed.success) {
    throw refusal(parsed.error.issues, source);
  }
  return parsed.data.policies;
}

/** Candidate policies to preview, and the workloads new WorkloadSelector ones are to select. */
export interface PolicyCandidates {
  policies: Policy[];
  selects: Record<string, string[]>;
}

/**
 * Parses candidate policies (YAML, either dialect of string matches, or JSON) as the preview takes them: one policy,
 * a list, or `{ policies, selects }`. Throws LocalConfigError naming `source`, the path and the problem.
 */
export function parsePolicyCandidates(text: string, source: string): PolicyCandidates {
  let raw: unknown;
  try {
    raw = JSON.parse(yamlToJson(text));
  } catch (err) {
    if (err instanceof ZtunnelError) throw err; // no native binary
    throw new LocalConfigError(`${source}: ${(err as Error).message}`);
  }
  if (raw === null) throw new LocalConfigError(`${source}: empty: expected a policy, a list of policies, or { policies, selects }`);
  // A document's other keys make it the wrapped form too, whose schema names them as fields a preview does not take.
  const wrapped = typeof raw === 'object' && !Array.isArray(raw) && ['policies', 'selects', 'workloads', 'services'].some((k) => k in raw);
  // A lone policy or a list is read as `{ policies }`; its paths are reported as written (without `policies`).
  const doc = wrapped ? raw : { policies: Array.isArray(raw) ? raw : [raw] };
  const parsed = candidatesSchema.safeParse(doc, { reportInput: true });
  if (!parsed.success) {
    const asWritten = (issue: z.core.$ZodIssue): z.core.$ZodIssue => {
      if (wrapped || issue.path[0] !== 'policies') return issue;
      return { ...issue, path: Array.isArray(raw) ? issue.path.slice(1) : issue.path.slice(2) };
    };
    throw refusal(parsed.error.issues.map(asWritten), source);
  }
  return parsed.data;
}

/** The local config's text as read, and where it came from (the file path, or "LOCAL_XDS"). */
export interface LocalText {
  source: string;
  text: Buffer;
}

/**
 * Reads LOCAL_XDS_PATH or LOCAL_XDS; null when neither is set. `reload`: an empty file is refused instead of read as
 * an empty config (a writer that truncates, then writes, is seen empty: applying that would remove every workload).
 */
export async function readLocalText(
  cfg: { localXdsPath: string | null; localXds: string | null },
  { reload = false }: { reload?: boolean } = {},
): Promise<LocalText | null> {
  if (cfg.localXds !== null) return { source: 'LOCAL_XDS', text: Buffer.from(cfg.localXds, 'utf8') };
  if (cfg.localXdsPath === null) return null;
  let text: Buffer;
  try {
    text = await readFile(cfg.localXdsPath);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    const problem = code === 'ENOENT' ? 'no such file' : code === 'EACCES' ? 'permission denied' : String(err);
    throw new LocalConfigError(`${cfg.localXdsPath}: cannot read the local config: ${problem}`, { cause: err });
  }
  if (reload && isBlank(text)) {
    throw new LocalConfigError(`${cfg.localXdsPath}: the file is empty (an empty file is an empty config only at startup)`);
  }
  return { source: cfg.localXdsPath, text };
}

/** Whitespace only, as String.prototype.trim sees it (decoded only when a byte is not ASCII whitespace or text). */
function isBlank(text: Buffer): boolean {
  for (const b of text) {
    if (b === 0x20 || (b >= 0x09 && b <= 0x0d)) continue;
    return b < 0x80 ? false : text.toString('utf8').trim() === '';
  }
  return true;
}

/** Loads LOCAL_XDS_PATH or LOCAL_XDS the slow way (parsed and validated here, in full); null when neither is set. */
export async function loadLocalConfig(
  cfg: { localXdsPath: string | null; localXds: string | null },
  opts: { reload?: boolean } = {},
): Promise<LocalConfig | null> {
  const read = await readLocalText(cfg, opts);
  return read === null ? null : parseLocalConfig(read.text.toString('utf8'), read.source);
}
