#!/usr/bin/env python3
"""A small authoritative DNS server (dnspython) standing in for the cluster's resolver in the namespace suite.

usage: dns_upstream.py <ip> <port> <external.test A address>
  external.test.  A <address>                  (what the mesh does not know: forwarded to us)
  big.test.       TXT, 40 records (~1.6 KB)    over UDP without room: TC set and no answers (the client retries
                                               over TCP, as resolvers do)
  slow.test.      never answered
  cached.test.    A 10.9.9.9, TTL 60           (asked twice: the second from the proxy's cache)
  gone.test.      NXDOMAIN with the SOA of test. (TTL 300, MINIMUM 2: a negative answer kept 2 s)
  anything else   NXDOMAIN, no SOA (not kept)
Prints {"event":"listening"} once both sockets are bound, then {"event":"query","transport":...,"name":...} for each
question.
"""
import json
import socket
import socketserver
import sys
import threading

import dns.flags
import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset

IP, PORT, EXTERNAL = sys.argv[1], int(sys.argv[2]), sys.argv[3]
lock = threading.Lock()


def say(o):
    with lock:
        sys.stdout.write(json.dumps(o) + "\n")
        sys.stdout.flush()


def answer(wire, transport):
    q = dns.message.from_wire(wire)
    name = q.question[0].name.to_text().lower()
    rdtype = q.question[0].rdtype
    say({"event": "query", "transport": transport, "name": name, "type": dns.rdatatype.to_text(rdtype)})
    if name == "slow.test.":
        return None
    r = dns.message.make_response(q)
    r.flags |= dns.flags.AA
    if name == "external.test." and rdtype == dns.rdatatype.A:
        r.answer.append(dns.rrset.from_text(name, 60, "IN", "A", EXTERNAL))
    elif name == "big.test." and rdtype == dns.rdatatype.TXT:
        r.answer.append(dns.rrset.from_text_list(name, 60, "IN", "TXT", [f'"record {i:02d} {"x" * 30}"' for i in range(40)]))
    elif name == "cached.test." and rdtype == dns.rdatatype.A:
        r.answer.append(dns.rrset.from_text(name, 60, "IN", "A", "10.9.9.9"))
    elif name == "gone.test.":
        r.set_rcode(dns.rcode.NXDOMAIN)
        r.authority.append(dns.rrset.from_text("test.", 300, "IN", "SOA", "ns.test. admin.test. 1 3600 600 86400 2"))
    elif name not in ("external.test.", "big.test.", "cached.test."):
        r.set_rcode(dns.rcode.NXDOMAIN)
    limit = 65535 if transport == "tcp" else (q.payload if q.edns >= 0 else 512)
    wire = r.to_wire()
    if len(wire) > limit:
        t = dns.message.make_response(q)
        t.flags |= dns.flags.TC
        wire = t.to_wire()
    return wire


class Udp(socketserver.BaseRequestHandler):
    def handle(self):
        data, sock = self.request
        out = answer(data, "udp")
        if out is not None:
            sock.sendto(out, self.client_address)


class Tcp(socketserver.BaseRequestHandler):
    def handle(self):
        while True:
            head = self.request.recv(2)
            if len(head) < 2:
                return
            n = int.from_bytes(head, "big")
            data = b""
            while len(data) < n:
                chunk = self.request.recv(n - len(data))
                if not chunk:
                    return
                data += chunk
            out = answer(data, "tcp")
            if out is not None:
                self.request.sendall(len(out).to_bytes(2, "big") + out)


class UdpServer(socketserver.ThreadingUDPServer):
    allow_reuse_address = True
    daemon_threads = True


class TcpServer(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True


udp = UdpServer((IP, PORT), Udp)
tcp = TcpServer((IP, PORT), Tcp)
threading.Thread(target=udp.serve_forever, daemon=True).start()
say({"event": "listening"})
tcp.serve_forever()
