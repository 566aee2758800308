// `ztunnel-node authz check`: ask a running daemon why a connection would be allowed or denied. It calls the admin
// endpoint /debug/authorize, which runs the dataplane's own evaluation (native rbac), so the answer is the one
// enforcement would give.
import { parseArgs } from 'node:util';

export const AUTHZ_USAGE = `usage: ztunnel-node authz check --dst <workload ip:port> [--src-identity <spiffe://...>] [--src-ip <ip>]
                               [--admin <addr>] [--json]

Asks the daemon whose admin server is at --admin (default: ADMIN_ADDR or 127.0.0.1:15000) how its L4
authorization would decide an inbound connection to the workload at --dst. Without --src-identity the connection
is plaintext (no identity). Prints the decision, the deciding policy and rule, and every policy considered.
Exit status: 0 allowed, 3 denied, 2 usage error, 1 the daemon could not answer.
`;

export const EXIT_DENIED = 3;

interface Considered {
  policy: string;
  action: string;
  dryRun: boolean;
  via: string;
  matchedRule: number | null;
  known: boolean;
}

interface Answer {
  workload: { uid: string; name: string; namespace: string };
  decision: { allowed: boolean; policy?: string; rule?: number; reason: string };
  considered: Considered[];
}

export function formatAnswer(a: Answer): string {
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

export async function runAuthz(args: readonly string[], env: Readonly<Record<string, string | undefined>>): Promise<number> {
  const [sub, ...rest] = args;
  if (sub !== 'check' || rest.some((a) => a === '--help' || a === '-h')) {
    (sub === 'check' ? process.stdout : process.stderr).write(AUTHZ_USAGE);
    return sub === 'check' ? 0 : 2;
  }
  let values: Record<string, string | boolean | undefined>;
  try {
    ({ values } = parseArgs({
      args: [...rest],
      options: {
        dst: { type: 'string' },
        'src-identity': { type: 'string' },
        'src-ip': { type: 'string' },
        admin: { type: 'string' },
        json: { type: 'boolean' },
      },
    }));
  } catch (err) {
    process.stderr.write(`ztunnel-node authz check: ${(err as Error).message}\n\n${AUTHZ_USAGE}`);
    return 2;
  }
  const str = (k: string) => (typeof values[k] === 'string' ? (values[k] as string) : undefined);
  const dst = str('dst');
  if (dst === undefined) {
    process.stderr.write(`ztunnel-node authz check: --dst is required\n\n${AUTHZ_USAGE}`);
    return 2;
  }
  const admin = str('admin') ?? env.ADMIN_ADDR ?? '127.0.0.1:15000';
  const q = new URLSearchParams({ dst });
  const id = str('src-identity');
  if (id !== undefined) q.set('src_identity', id);
  const ip = str('src-ip');
  if (ip !== undefined) q.set('src_ip', ip);
  let res: Response;
  try {
    res = await fetch(`http://${admin}/debug/authorize?${q}`);
  } catch (err) {
    process.stderr.write(`ztunnel-node authz check: cannot reach the admin server at ${admin}: ${(err as Error).message}\n`);
    return 1;
  }
  const body = await res.text();
  if (res.status !== 200) {
    process.stderr.write(`ztunnel-node authz check: ${admin} answered ${res.status}: ${body}`);
    return res.status === 400 ? 2 : 1;
  }
  const answer = JSON.parse(body) as Answer;
  process.stdout.write(values.json === true ? body : formatAnswer(answer));
  return answer.decision.allowed ? 0 : EXIT_DENIED;
}
