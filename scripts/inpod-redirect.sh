#!/usr/bin/env bash
# Installs istio-cni's in-pod redirection inside a pod network namespace (Istio cni/pkg/iptables, the rules of
# its golden file testdata/default.golden): outbound TCP to 15001, inbound TCP (except 15008) to 15006, ztunnel's
# own marked traffic (0x539) exempt, kubelet probes from 169.254.7.127 exempt, and the connmark + policy route that
# delivers replies to ztunnel's transparent sockets. IPv4 only.
# DNS capture, as istio-cni installs it when DNS capture is on (Istio's default since 1.25): the pod's DNS over UDP
# (not via lo) and TCP (not to 127.0.0.1) to port 53 goes to the DNS proxy on 15053, ztunnel's own marked queries to
# the upstream resolvers excepted; conntrack zone 1 keeps those upstream flows apart from the pod's redirected ones.
#   usage: inpod-redirect.sh [--no-dns] <netns name>        (needs root)
#          inpod-redirect.sh --remove <netns name>
set -euo pipefail
if [ "${1:-}" = "--remove" ]; then
  ns=$2
  ip netns exec "$ns" iptables -t mangle -F 2>/dev/null || true
  ip netns exec "$ns" iptables -t nat -F 2>/dev/null || true
  ip netns exec "$ns" iptables -t raw -F 2>/dev/null || true
  ip netns exec "$ns" ip rule del fwmark 0x111/0xfff pref 32764 lookup 100 2>/dev/null || true
  ip netns exec "$ns" ip route flush table 100 2>/dev/null || true
  exit 0
fi
dns=1
if [ "${1:-}" = "--no-dns" ]; then
  dns=0
  shift
fi
ns=${1:?usage: inpod-redirect.sh [--no-dns] <netns name>}
MARK=0x539/0xfff
TPROXY_MARK=0x111/0xfff
PROBE=169.254.7.127

ip netns exec "$ns" iptables-restore <<RULES
*mangle
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:ISTIO_PRERT - [0:0]
:ISTIO_OUTPUT - [0:0]
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_PRERT -m mark --mark $MARK -j CONNMARK --set-xmark $TPROXY_MARK
-A ISTIO_OUTPUT -m connmark --mark $TPROXY_MARK -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:ISTIO_PRERT - [0:0]
:ISTIO_OUTPUT - [0:0]
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_PRERT -s $PROBE/32 -p tcp -m tcp -j ACCEPT
-A ISTIO_OUTPUT -d $PROBE/32 -p tcp -m tcp -j ACCEPT
-A ISTIO_PRERT ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m mark ! --mark $MARK -j REDIRECT --to-ports 15006
$(if [ $dns = 1 ]; then
  echo "-A ISTIO_OUTPUT ! -o lo -p udp -m mark ! --mark $MARK -m udp --dport 53 -j REDIRECT --to-port 15053"
  echo "-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp --dport 53 -m mark ! --mark $MARK -j REDIRECT --to-ports 15053"
fi)
-A ISTIO_OUTPUT -p tcp -m mark --mark $TPROXY_MARK -j ACCEPT
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -o lo -j ACCEPT
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp -m mark ! --mark $MARK -j REDIRECT --to-ports 15001
COMMIT
$(if [ $dns = 1 ]; then cat <<RAW
*raw
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:ISTIO_PRERT - [0:0]
:ISTIO_OUTPUT - [0:0]
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_OUTPUT -p udp -m mark --mark $MARK -m udp --dport 53 -j CT --zone 1
-A ISTIO_PRERT -p udp -m mark ! --mark $MARK -m udp --sport 53 -j CT --zone 1
COMMIT
RAW
fi)
RULES
ip netns exec "$ns" ip rule add fwmark $TPROXY_MARK pref 32764 lookup 100
ip netns exec "$ns" ip route add local 0.0.0.0/0 dev lo table 100
