// The ZDS schema in proto/ (and the TypeScript generated from it) against the wire bytes the Rust dataplane pins in
// native/dataplane/src/inpod/zds.rs: both sides must agree with Istio's field numbers (DelWorkload.uid = 2,
// WorkloadRequest.keep = 5).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { create, toBinary } from '@bufbuild/protobuf';
import {
  DelWorkloadSchema,
  KeepWorkloadSchema,
  SnapshotSentSchema,
  WorkloadRequestSchema,
  ZdsHelloSchema,
  Version,
} from '../../dist/gen/istio/workload/zds/zds_pb.js';

const hex = (b: Uint8Array): string => Buffer.from(b).toString('hex');

test('ZDS messages encode to the bytes istio-cni and the Rust dataplane use', () => {
  const del = create(WorkloadRequestSchema, { payload: { case: 'del', value: create(DelWorkloadSchema, { uid: 'u' }) } });
  assert.equal(hex(toBinary(WorkloadRequestSchema, del)), '1203120175');
  const keep = create(WorkloadRequestSchema, { payload: { case: 'keep', value: create(KeepWorkloadSchema, { uid: 'u' }) } });
  assert.equal(hex(toBinary(WorkloadRequestSchema, keep)), '2a030a0175');
  const snap = create(WorkloadRequestSchema, { payload: { case: 'snapshotSent', value: create(SnapshotSentSchema, {}) } });
  assert.equal(hex(toBinary(WorkloadRequestSchema, snap)), '1a00');
  assert.equal(hex(toBinary(ZdsHelloSchema, create(ZdsHelloSchema, { version: Version.V1 }))), '0801');
});
