// The resolver file the DNS proxy forwards to (resolv.conf(5)).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { parseResolvConf, readResolvConf } from '../../dist/config/resolv-conf.js';

test('nameservers (IPv4, IPv6 with its zone dropped) on port 53, in order; comments and unknown lines ignored', () => {
  const r = parseResolvConf(
    '# generated\nnameserver 10.96.0.10\nnameserver fe80::1%eth0 ; link-local\noptions ndots:5\nnameserver not-an-ip\nsearch default.svc.cluster.local svc.cluster.local cluster.local\n',
  );
  assert.deepEqual(r.nameservers, ['10.96.0.10:53', '[fe80::1]:53']);
  assert.deepEqual(r.search, ['default.svc.cluster.local', 'svc.cluster.local', 'cluster.local']);
});

test('the last of domain and search wins', () => {
  assert.deepEqual(parseResolvConf('search a.example b.example\ndomain corp.example\n').search, ['corp.example']);
  assert.deepEqual(parseResolvConf('domain corp.example\nsearch a.example\n').search, ['a.example']);
});

test('an unreadable file: no servers, and the reason', () => {
  const r = readResolvConf('/nonexistent/resolv.conf');
  assert.deepEqual([r.nameservers, r.search], [[], []]);
  assert.match(r.error!, /\/nonexistent\/resolv\.conf: ENOENT/);
});
