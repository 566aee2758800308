#!/usr/bin/env python3
"""Ask DNS questions with dnspython (a real resolver library) and print what came back, as JSON.

argv[1]: a JSON list of questions, each {server, port, name, type, tcp?, payload? (EDNS payload; absent: no EDNS),
ednsVersion?, timeout?, source? (the address to ask from)}. Prints a JSON list of answers, each {rcode, tc, aa, ra, answers: [{name, type, ttl, data}],
edns: {payload, version} | null} or {error}.
"""
import json
import sys

import dns.flags
import dns.message
import dns.query
import dns.rcode
import dns.rdatatype


def ask(q):
    payload = q.get("payload")
    msg = dns.message.make_query(
        q["name"],
        q.get("type", "A"),
        use_edns=payload is not None,
        payload=payload or 512,
        ednsflags=0,
    )
    if payload is not None and q.get("ednsVersion"):
        msg.use_edns(edns=q["ednsVersion"], payload=payload)
    timeout = q.get("timeout", 3)
    try:
        if q.get("tcp"):
            r = dns.query.tcp(msg, q["server"], port=q["port"], timeout=timeout, source=q.get("source"))
        else:
            r = dns.query.udp(msg, q["server"], port=q["port"], timeout=timeout, ignore_trailing=True)
    except Exception as e:  # noqa: BLE001 - the test wants the reason, whatever it is
        return {"error": f"{type(e).__name__}: {e}"}
    answers = []
    for rrset in r.answer:
        for rd in rrset:
            answers.append(
                {"name": rrset.name.to_text(), "type": dns.rdatatype.to_text(rrset.rdtype), "ttl": rrset.ttl, "data": rd.to_text()}
            )
    return {
        "rcode": dns.rcode.to_text(r.rcode()),
        "tc": bool(r.flags & dns.flags.TC),
        "aa": bool(r.flags & dns.flags.AA),
        "ra": bool(r.flags & dns.flags.RA),
        "answers": answers,
        "edns": None if r.edns < 0 else {"payload": r.payload, "version": r.edns},
    }


print(json.dumps([ask(q) for q in json.loads(sys.argv[1])]))
