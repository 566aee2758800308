// The dataplane's WDS decoder (native/mesh/src/state/wds.rs) from the tests' side: a Workload or Service built
// (or encoded) by an independent encoder, wrapped as an istio.workload.Address, decoded and validated exactly as an
// xDS push is, and returned in the control side's model. A refused one throws its NACK reason.
import { create, toBinary, type MessageInitShape } from '@bufbuild/protobuf';
import { AddressSchema, ServiceSchema, WorkloadSchema } from '../../dist/gen/istio/workload/workload_pb.js';
import { decodeAddress, type Service, type Workload } from '../../dist/native/index.js';

/** An Address body around an already encoded Workload (field 1) or Service (field 2). */
export function addressBody(kind: 'workload' | 'service', encoded: Uint8Array): Uint8Array {
  const len: number[] = [];
  for (let n = encoded.length; ; n >>>= 7) {
    if (n < 0x80) {
      len.push(n);
      break;
    }
    len.push((n & 0x7f) | 0x80);
  }
  return Uint8Array.from([kind === 'workload' ? 0x0a : 0x12, ...len, ...encoded]);
}

/** A Workload message (or its init fields) → the dataplane's workload record. */
export function nativeWorkload(w: MessageInitShape<typeof WorkloadSchema>): Workload {
  const value = create(WorkloadSchema, w);
  // A workload Address decodes to its workload (or throws).
  return decodeAddress(toBinary(AddressSchema, create(AddressSchema, { type: { case: 'workload', value } }))).workload!;
}

/** A Service message (or its init fields) → the dataplane's service record. */
export function nativeService(s: MessageInitShape<typeof ServiceSchema>): Service {
  const value = create(ServiceSchema, s);
  // A service Address decodes to its service (or throws).
  return decodeAddress(toBinary(AddressSchema, create(AddressSchema, { type: { case: 'service', value } }))).service!;
}
