// PEM helpers: chains cross the native boundary as concatenated PEM blocks.
import { X509Certificate } from 'node:crypto';

const BLOCK = /-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g;

/** The certificate blocks of a PEM bundle, in order, each ending with a newline. */
export function splitPem(bundle: string): string[] {
  return (bundle.match(BLOCK) ?? []).map((b) => `${b}\n`);
}

/** One certificate as config_dump shows it (ztunnel's keys). */
export interface CertificateDump {
  /** base64 of the PEM text */
  pem: string;
  /** decimal, as ztunnel prints it */
  serialNumber: string;
  validFrom: string;
  expirationTime: string;
}

/** RFC 3339 in UTC with second precision (certificate times have no fractions). */
export function rfc3339(date: Date): string {
  return date.toISOString().replace(/\.\d{3}Z$/, 'Z');
}

export function describeCertificate(pem: string): CertificateDump {
  const cert = new X509Certificate(pem);
  return {
    pem: Buffer.from(pem).toString('base64'),
    serialNumber: BigInt(`0x${cert.serialNumber}`).toString(10),
    validFrom: rfc3339(new Date(cert.validFrom)),
    expirationTime: rfc3339(new Date(cert.validTo)),
  };
}

/** The validity window of the first certificate in `chainPem` (the leaf). */
export function leafValidity(chainPem: string): { notBefore: Date; notAfter: Date } {
  const [leaf] = splitPem(chainPem);
  if (leaf === undefined) throw new Error('the chain holds no certificate');
  const cert = new X509Certificate(leaf);
  return { notBefore: new Date(cert.validFrom), notAfter: new Date(cert.validTo) };
}
