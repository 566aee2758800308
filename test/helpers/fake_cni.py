#!/usr/bin/env python3
"""A fake istio-cni node agent for the namespace tests: a real SOCK_SEQPACKET server on a Unix socket that speaks ZDS
(package istio.workload.zds) to ztunnel-node and passes real network-namespace fds with SCM_RIGHTS.

Driven by the test over stdin/stdout, one JSON object per line:
  in : {"op": "add", "uid": U, "netns": "/run/netns/NAME", "name": N, "namespace": NS, "serviceAccount": SA}
       {"op": "keep", "uid": U} | {"op": "del", "uid": U} | {"op": "snapshot"} | {"op": "close"}
       {"op": "raw", "hex": "..."}   (send bytes as-is: protocol-violation tests)
  out: {"event": "listening"} | {"event": "connected", "hello": "<hex>"} | {"event": "ack", "op": ..., "error": "..."}
       {"event": "disconnected"} | {"event": "error", "message": ...}
The protobuf encoding is written out by hand below (a handful of string and message fields), so the helper needs
nothing but the standard library; field numbers are Istio's (DelWorkload.uid = 2, WorkloadRequest.keep = 5).
"""
import array
import json
import os
import socket
import sys
import threading


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_bytes(num, payload):
    return varint((num << 3) | 2) + varint(len(payload)) + payload


def field_str(num, s):
    return field_bytes(num, s.encode())


def add_request(uid, name, namespace, sa):
    info = field_str(1, name) + field_str(2, namespace) + field_str(3, sa)
    add = field_str(1, uid) + field_bytes(2, info)
    return field_bytes(1, add)


def keep_request(uid):
    return field_bytes(5, field_str(1, uid))


def del_request(uid):
    return field_bytes(2, field_str(2, uid))


def snapshot_request():
    return field_bytes(3, b"")


def parse_ack(data):
    """WorkloadResponse{ack=1: Ack{error=1}} -> error string ('' = ok)."""
    i = 0

    def read_varint(buf, i):
        shift = n = 0
        while True:
            b = buf[i]
            i += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return n, i

    key, i = read_varint(data, i)
    if key != (1 << 3) | 2:
        raise ValueError("not an ack: %s" % data.hex())
    ln, i = read_varint(data, i)
    ack = data[i:i + ln]
    if not ack:
        return ""
    k2, j = read_varint(ack, 0)
    l2, j = read_varint(ack, j)
    return ack[j:j + l2].decode()


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main():
    path = sys.argv[1]
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    srv.bind(path)
    srv.listen(4)
    emit({"event": "listening"})
    state = {"conn": None}
    lock = threading.Lock()
    connected = threading.Event()

    def accept_loop():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            hello = conn.recv(1024)
            with lock:
                # Like istio-cni, updates go to the newest connection; older ones stay open (a draining daemon
                # keeps its connection until it exits).
                state["conn"] = conn
                state.setdefault("all", []).append(conn)
            emit({"event": "connected", "hello": hello.hex()})
            connected.set()

    threading.Thread(target=accept_loop, daemon=True).start()

    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "close":
            with lock:
                if state["conn"] is not None:
                    state["conn"].close()
                    state["conn"] = None
            emit({"event": "closed"})
            continue
        if op == "exit":
            break
        connected.wait(30)
        with lock:
            conn = state["conn"]
        if conn is None:
            emit({"event": "error", "message": "not connected"})
            continue
        fds = []
        if op == "add":
            msg = add_request(cmd["uid"], cmd.get("name", ""), cmd.get("namespace", ""), cmd.get("serviceAccount", ""))
            fds = [os.open(cmd["netns"], os.O_RDONLY)]
        elif op == "keep":
            msg = keep_request(cmd["uid"])
        elif op == "del":
            msg = del_request(cmd["uid"])
        elif op == "snapshot":
            msg = snapshot_request()
        elif op == "raw":
            msg = bytes.fromhex(cmd["hex"])
        else:
            emit({"event": "error", "message": "unknown op " + op})
            continue
        try:
            if fds:
                conn.sendmsg([msg], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
            else:
                conn.send(msg)
            conn.settimeout(10)
            resp = conn.recv(1024)
            conn.settimeout(None)
            if not resp:
                emit({"event": "disconnected", "op": op})
            else:
                emit({"event": "ack", "op": op, "uid": cmd.get("uid"), "error": parse_ack(resp)})
        except (OSError, ValueError) as e:
            emit({"event": "error", "op": op, "message": str(e)})
        finally:
            for fd in fds:
                os.close(fd)
    srv.close()


if __name__ == "__main__":
    main()
