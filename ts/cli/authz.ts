// `ztunnel-node authz`: ask a running daemon about its L4 authorization through its admin server.
// - `check`: why a connection would be allowed or denied (/debug/authorize);
// - `preview FILE`: what candidate policies would do if applied (POST /debug/authz/preview): the live connections they
//   would close and the recent denied attempts they would allow, nothing applied.
// Both run the dataplane's own evaluation (native rbac), so the answers are the ones enforcement would give.
import { readFile } from 'node:fs/promises';
import { text } from 'node:stream/consumers';
import { parseArgs } from 'node:util';
import type { AuthorizeDecision, AuthorizeExplanation, AuthzPreview, PreviewFlow } from '../native/types.js';

const CHECK_USAGE = `usage: ztunnel-node authz check --dst <workload ip:port> [--src-identity <spiffe://...>] [--src-ip <ip>]
                               [--admin <addr>] [--json]

Asks the daemon whose admin server is at --admin (default: ADMIN_ADDR or 127.0.0.1:15000) how its L4
authorization would decide an inbound connection to the workload at --dst. Without --src-identity the connection
is plaintext (no identity). Prints the decision, the deciding policy and rule, and every policy considered.
Exit status: 0 allowed, 3 denied, 2 usage error, 1 the daemon could not answer.
`;

const PREVIEW_USAGE = `usage: ztunnel-node authz preview <FILE | -> [--admin <addr>] [--json]

Asks the daemon whose admin server is at --admin (default: ADMIN_ADDR or 127.0.0.1:15000) what the candidate
authorization policies in FILE (- for stdin) would do if applied, without applying them: the live inbound connections
on its node they would close, and the recent denied attempts (its last 1000) they would allow, each with the
policy and rule that would decide. FILE holds one policy as the local config writes it (string matches as
{Exact: x} or !Exact x), a list of them, or { policies: [...], selects: { <ns>/<name>: [<workload uid>...] } } to
have a new WorkloadSelector policy select workloads that do not name it yet. Each candidate replaces the policy of
its namespace/name, as applying it would; a dry-run candidate is judged as if enforced.
Exit status: 0 no live connection would close and no recent denied attempt would be allowed; 3 live connections
would close; 4 none would close but recent denied attempts would be allowed; 2 usage error or a candidate the daemon
refuses; 1 the daemon could not answer.
`;

export const AUTHZ_USAGE = `${CHECK_USAGE}\n${PREVIEW_USAGE}`;

export const EXIT_DENIED = 3;
/** `authz preview`: the candidates would close live connections. */
export const EXIT_WOULD_CLOSE = 3;
/** `authz preview`: they would close none, but would allow recently denied attempts. */
export const EXIT_WOULD_ALLOW = 4;

export function formatAnswer(a: AuthorizeExplanation): string {
  const lines = [
    `workload:  ${a.workload.namespace}/${a.workload.name} (${a.workload.uid})`,
    `decision:  ${a.decision.allowed ? 'ALLOW' : 'DENY'}`,
    `reason:    ${a.decision.reason}`,
  ];
  if (a.decision.policy !== undefined) {
    lines.push(`decided by: ${a.decision.policy}${a.decision.rule !== undefined ? ` (rule ${a.decision.rule})` : ''}`);
  }
  lines.push(`policies considered: ${a.considered.length}`);
  for (const c of a.considered) {
    const state = !c.known ? 'NOT KNOWN (fail closed)' : c.matchedRule === null ? 'no match' : `matched rule ${c.matchedRule}`;
    lines.push(`  ${c.policy.padEnd(40)} ${c.action.padEnd(5)}${c.dryRun ? ' dry-run' : ''}  via ${c.via.padEnd(9)}  ${state}`);
  }
  return lines.join('\n') + '\n';
}

/** "denied by ns/name rule 0", or the reason when no policy decided ("allowed (no allow policies, allow)"). */
function decided(d: AuthorizeDecision): string {
  const verdict = d.allowed ? 'allowed' : 'denied';
  if (d.policy === undefined) return `${verdict} (${d.reason})`;
  return `${verdict} by ${d.policy}${d.rule !== undefined ? ` rule ${d.rule}` : ` (${d.reason})`}`;
}

function flow(f: PreviewFlow, what: string): string[] {
  const src = `${f.srcIdentity ?? 'plaintext'} from ${f.srcIp}`;
  const when = f.lastDeniedMs === undefined ? '' : `, last ${new Date(f.lastDeniedMs).toISOString()}`;
  return [
    `  ${f.workload.namespace}/${f.workload.name} ${f.dst} <- ${src} [${f.protocol}] ${f.count} ${what}${when}`,
    `      now:  ${decided(f.now)}`,
    `      with: ${decided(f.candidate)}`,
  ];
}

export function formatPreview(p: AuthzPreview): string {
  const lines = [`candidates: ${p.candidates.join(', ')}`];
  if (p.judgedAsEnforced.length > 0) lines.push(`dry-run, judged as if enforced: ${p.judgedAsEnforced.join(', ')}`);
  lines.push(`judged: ${p.connectionsJudged} live connection(s), ${p.denialsJudged} recent denied attempt(s) the candidates can affect`);
  lines.push(`would close ${p.wouldCloseConnections} live connection(s)${p.wouldCloseConnections > 0 ? ':' : ''}`);
  for (const f of p.wouldClose) lines.push(...flow(f, 'connection(s)'));
  lines.push(`would allow ${p.wouldAllowAttempts} recently denied attempt(s)${p.wouldAllowAttempts > 0 ? ':' : ''}`);
  for (const f of p.wouldAllow) lines.push(...flow(f, 'attempt(s)'));
  if (p.truncated) lines.push('(lists cut at the limit; the counts are complete)');
  return lines.join('\n') + '\n';
}

/** The exit status of a preview: what it would do, most disruptive first. */
export function previewStatus(p: AuthzPreview): number {
  if (p.wouldCloseConnections > 0) return EXIT_WOULD_CLOSE;
  return p.wouldAllowAttempts > 0 ? EXIT_WOULD_ALLOW : 0;
}

type Values = Record<string, string | boolean | undefined>;

function parse(sub: string, rest: readonly string[], options: Record<string, { type: 'string' | 'boolean' }>, usage: string): { values: Values; positionals: string[] } | null {
  try {
    return parseArgs({ args: [...rest], options, allowPositionals: sub === 'preview' });
  } catch (err) {
    process.stderr.write(`ztunnel-node authz ${sub}: ${(err as Error).message}\n\n${usage}`);
    return null;
  }
}

/** Asks the admin server; null (said on stderr) when it cannot be reached. */
async function ask(sub: string, admin: string, path: string, init?: RequestInit): Promise<{ status: number; body: string } | null> {
  try {
    const res = await fetch(`http://${admin}${path}`, init);
    return { status: res.status, body: await res.text() };
  } catch (err) {
    process.stderr.write(`ztunnel-node authz ${sub}: cannot reach the admin server at ${admin}: ${(err as Error).message}\n`);
    return null;
  }
}

export async function runAuthz(args: readonly string[], env: Readonly<Record<string, string | undefined>>): Promise<number> {
  const [sub, ...rest] = args;
  const usage = sub === 'check' ? CHECK_USAGE : sub === 'preview' ? PREVIEW_USAGE : AUTHZ_USAGE;
  if (sub === undefined || usage === AUTHZ_USAGE || rest.some((a) => a === '--help' || a === '-h')) {
    (usage === AUTHZ_USAGE ? process.stderr : process.stdout).write(usage);
    return usage === AUTHZ_USAGE ? 2 : 0;
  }
  const adminOf = (values: Values) => (typeof values.admin === 'string' ? values.admin : undefined) ?? env.ADMIN_ADDR ?? '127.0.0.1:15000';
  return sub === 'check' ? check(rest, adminOf) : preview(rest, adminOf);
}

async function check(rest: readonly string[], adminOf: (v: Values) => string): Promise<number> {
  const parsed = parse('check', rest, { dst: { type: 'string' }, 'src-identity': { type: 'string' }, 'src-ip': { type: 'string' }, admin: { type: 'string' }, json: { type: 'boolean' } }, CHECK_USAGE);
  if (parsed === null) return 2;
  const { values } = parsed;
  const str = (k: string) => (typeof values[k] === 'string' ? values[k] : undefined);
  const dst = str('dst');
  if (dst === undefined) {
    process.stderr.write(`ztunnel-node authz check: --dst is required\n\n${CHECK_USAGE}`);
    return 2;
  }
  const admin = adminOf(values);
  const q = new URLSearchParams({ dst });
  const id = str('src-identity');
  if (id !== undefined) q.set('src_identity', id);
  const ip = str('src-ip');
  if (ip !== undefined) q.set('src_ip', ip);
  const res = await ask('check', admin, `/debug/authorize?${q}`);
  if (res === null) return 1;
  if (res.status !== 200) {
    process.stderr.write(`ztunnel-node authz check: ${admin} answered ${res.status}: ${res.body}`);
    return res.status === 400 ? 2 : 1;
  }
  const answer = JSON.parse(res.body) as AuthorizeExplanation;
  process.stdout.write(values.json === true ? res.body : formatAnswer(answer));
  return answer.decision.allowed ? 0 : EXIT_DENIED;
}

async function preview(rest: readonly string[], adminOf: (v: Values) => string): Promise<number> {
  const parsed = parse('preview', rest, { admin: { type: 'string' }, json: { type: 'boolean' } }, PREVIEW_USAGE);
  if (parsed === null) return 2;
  const { values, positionals } = parsed;
  if (positionals.length !== 1) {
    process.stderr.write(`ztunnel-node authz preview: ${positionals.length === 0 ? 'a FILE is required' : 'one FILE only'}\n\n${PREVIEW_USAGE}`);
    return 2;
  }
  const file = positionals[0] ?? '-';
  let body: string;
  try {
    body = file === '-' ? await text(process.stdin) : await readFile(file, 'utf8');
  } catch (err) {
    process.stderr.write(`ztunnel-node authz preview: cannot read ${file}: ${(err as Error).message}\n`);
    return 2;
  }
  const admin = adminOf(values);
  const res = await ask('preview', admin, '/debug/authz/preview', { method: 'POST', headers: { 'content-type': 'application/yaml' }, body });
  if (res === null) return 1;
  if (res.status !== 200) {
    process.stderr.write(`ztunnel-node authz preview: ${admin} answered ${res.status}: ${res.body}`);
    return res.status === 400 || res.status === 413 ? 2 : 1;
  }
  const answer = JSON.parse(res.body) as AuthzPreview;
  process.stdout.write(values.json === true ? res.body : formatPreview(answer));
  return previewStatus(answer);
}
