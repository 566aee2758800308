// istiod's CA: `/istio.v1.auth.IstioCertificateService/CreateCertificate` over TLS, behind the same
// CertificateAuthority interface as the built-in CA, so local mode and istiod mode share the manager.
//
// The response is checked before anything is installed: the leaf's SPIFFE URI SAN must be the identity asked
// for, each certificate must be signed by the next, the last intermediate (or the leaf) by one of the roots, and
// the last element holds the root(s), which become the trust bundle (several are allowed, for root rotation).
import { X509Certificate } from 'node:crypto';
import { create, fromBinary, toBinary } from '@bufbuild/protobuf';
import * as grpc from '@grpc/grpc-js';
import { ZtunnelError } from '../errors.js';
import {
  IstioCertificateRequestSchema,
  IstioCertificateResponseSchema,
  type IstioCertificateRequest,
  type IstioCertificateResponse,
} from '../gen/istio/ca/ca_pb.js';
import { channelCredentials, grpcTarget, requestMetadata, serverNameOptions, type ControlPlaneTarget } from '../xds/grpc.js';
import type { TokenSource } from '../xds/token.js';
import type { CertificateAuthority, SignedCertificate } from './authority.js';
import { splitPem } from './pem.js';

export const CREATE_CERTIFICATE_PATH = '/istio.v1.auth.IstioCertificateService/CreateCertificate';
/** A CSR that takes longer than this is a stuck CA; the manager's backoff takes over. */
const REQUEST_TIMEOUT_MS = 30_000;

export interface IstiodCaOptions {
  target: ControlPlaneTarget;
  token: TokenSource;
  clusterId: string;
  headers: Readonly<Record<string, string>>;
  /** Shared mode: ask for the identity on the workload's behalf (`ImpersonatedIdentity` in the metadata). */
  impersonate: boolean;
}

/** The first URI SAN of a certificate, or null. */
export function firstUriSan(cert: X509Certificate): string | null {
  const san = cert.subjectAltName ?? '';
  for (const part of san.split(/,\s*/)) {
    if (part.startsWith('URI:')) return part.slice(4);
  }
  return null;
}

/** Checks an IstioCertificateResponse chain for `identity`; returns it split into chain and roots. */
export function checkCertificateChain(certChain: readonly string[], identity: string): SignedCertificate {
  if (certChain.length === 0) throw new ZtunnelError('CA_UNAVAILABLE', 'the CA returned an empty certificate chain');
  // One element: leaf followed by the root(s) in one PEM bundle.
  const elements = certChain.length === 1 ? splitPem(certChain[0] as string) : certChain.map((e) => e);
  const roots = certChain.length === 1 ? elements.slice(1).join('') : (certChain[certChain.length - 1] as string);
  const chain = (certChain.length === 1 ? elements.slice(0, 1) : elements.slice(0, -1)).flatMap(splitPem);
  const rootCerts = splitPem(roots);
  if (chain.length === 0) throw new ZtunnelError('CA_UNAVAILABLE', 'the CA returned no leaf certificate');
  if (rootCerts.length === 0) throw new ZtunnelError('CA_UNAVAILABLE', 'the CA returned no root certificate');
  let parsed: X509Certificate[];
  let parsedRoots: X509Certificate[];
  try {
    parsed = chain.map((p) => new X509Certificate(p));
    parsedRoots = rootCerts.map((p) => new X509Certificate(p));
  } catch (err) {
    throw new ZtunnelError('CA_UNAVAILABLE', `the CA returned an unparsable certificate: ${(err as Error).message}`);
  }
  const leaf = parsed[0] as X509Certificate;
  const san = firstUriSan(leaf);
  if (san !== identity) {
    throw new ZtunnelError('CA_UNAVAILABLE', `the CA issued a certificate for ${san ?? '(no URI SAN)'}, not ${identity}`);
  }
  for (let i = 0; i + 1 < parsed.length; i++) {
    const cert = parsed[i] as X509Certificate;
    if (!cert.verify((parsed[i + 1] as X509Certificate).publicKey)) {
      throw new ZtunnelError('CA_UNAVAILABLE', `certificate ${i} of the chain is not signed by certificate ${i + 1}`);
    }
  }
  const top = parsed[parsed.length - 1] as X509Certificate;
  if (!parsedRoots.some((r) => top.verify(r.publicKey))) {
    throw new ZtunnelError('CA_UNAVAILABLE', 'the certificate chain does not verify against the returned root(s)');
  }
  return { chainPem: chain.join(''), rootsPem: rootCerts.join('') };
}

export class IstiodCertificateAuthority implements CertificateAuthority {
  constructor(private readonly opts: IstiodCaOptions) {}

  async sign(csrPem: string, identity: string, ttlSeconds: number): Promise<SignedCertificate> {
    const { opts } = this;
    const request = create(IstioCertificateRequestSchema, {
      csr: csrPem,
      validityDuration: BigInt(ttlSeconds),
      ...(opts.impersonate ? { metadata: { ImpersonatedIdentity: identity } } : {}),
    });
    // A fresh channel per request: the token file and root CA are re-read, and nothing lingers between the
    // (rare) requests. The manager bounds concurrency.
    const metadata = requestMetadata(opts.token, opts.clusterId, opts.headers);
    const client = new grpc.Client(grpcTarget(opts.target.address).target, channelCredentials(opts.target), {
      'grpc.use_local_subchannel_pool': 1,
      ...serverNameOptions(opts.target),
    });
    try {
      const response = await new Promise<IstioCertificateResponse>((resolve, reject) => {
        client.makeUnaryRequest(
          CREATE_CERTIFICATE_PATH,
          (req: IstioCertificateRequest) => Buffer.from(toBinary(IstioCertificateRequestSchema, req)),
          (buf: Buffer) => fromBinary(IstioCertificateResponseSchema, buf),
          request,
          metadata,
          { deadline: Date.now() + REQUEST_TIMEOUT_MS },
          (err, value) => {
            if (err) {
              reject(new ZtunnelError('CA_UNAVAILABLE', `CreateCertificate for ${identity}: ${grpc.status[err.code]}: ${err.details}`, { cause: err }));
            } else resolve(value as IstioCertificateResponse);
          },
        );
      });
      return checkCertificateChain(response.certChain, identity);
    } finally {
      client.close();
    }
  }
}
