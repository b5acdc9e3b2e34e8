#!/bin/sh
# A Canal node's rules (Flannel networking, Calico-style policy) as iptables-nft
# writes them. Run in a throwaway network namespace, then `nft list ruleset` is
# canal.list.nft:
#
#	unshare -n sh -c 'sh canal.sh && nft list ruleset' > canal.list.nft
#
# Pods 10.244.0.0/16 (this node 10.244.1.0/24 on cni0, interfaces cali*), the VXLAN
# device flannel.1; Calico's mark bits: 0x10000 accept, 0x20000 pass, 0x40000 scratch.
set -e
ipt() { iptables-nft -w "$@"; }

# Flannel: masquerade pod traffic leaving the cluster, accept pod forwarding.
ipt -t nat -N FLANNEL-POSTRTG
ipt -t nat -A POSTROUTING -m comment --comment "flanneld masq" -j FLANNEL-POSTRTG
ipt -t nat -A FLANNEL-POSTRTG -m mark --mark 0x4000/0x4000 -m comment --comment "flanneld masq" -j RETURN
ipt -t nat -A FLANNEL-POSTRTG -s 10.244.1.0/24 -d 10.244.0.0/16 -m comment --comment "flanneld masq" -j RETURN
ipt -t nat -A FLANNEL-POSTRTG -s 10.244.0.0/16 -d 10.244.1.0/24 -m comment --comment "flanneld masq" -j RETURN
ipt -t nat -A FLANNEL-POSTRTG ! -s 10.244.0.0/16 -d 10.244.1.0/24 -m comment --comment "flanneld masq" -j RETURN
ipt -t nat -A FLANNEL-POSTRTG -s 10.244.0.0/16 ! -d 224.0.0.0/4 -m comment --comment "flanneld masq" -j MASQUERADE --random-fully
ipt -t nat -A FLANNEL-POSTRTG ! -s 10.244.0.0/16 -d 10.244.0.0/16 -m comment --comment "flanneld masq" -j MASQUERADE --random-fully
ipt -N FLANNEL-FWD
ipt -A FORWARD -m comment --comment "flanneld forward" -j FLANNEL-FWD
ipt -A FLANNEL-FWD -s 10.244.0.0/16 -m comment --comment "flanneld forward" -j ACCEPT
ipt -A FLANNEL-FWD -d 10.244.0.0/16 -m comment --comment "flanneld forward" -j ACCEPT

# Calico-style policy: raw untracks nothing but marks workload traffic, filter
# dispatches by interface to per-endpoint chains whose policy sets the accept mark.
ipt -t raw -N cali-PREROUTING
ipt -t raw -I PREROUTING -m comment --comment "cali:6gwbT8clXdHdC1b1" -j cali-PREROUTING
ipt -t raw -A cali-PREROUTING -m comment --comment "cali:XFX5xbM8B9qR10JG" -j MARK --set-xmark 0x0/0xf0000
ipt -t raw -A cali-PREROUTING -i cali+ -m comment --comment "cali:EWMPb0zVROM-woQp" -j MARK --set-xmark 0x40000/0x40000
ipt -t raw -A cali-PREROUTING -m comment --comment "cali:PWuxTAIaFCtsg5Qa" -m mark --mark 0x40000/0x40000 -m rpfilter --validmark --invert -j DROP
ipt -N cali-FORWARD
ipt -N cali-from-wl-dispatch
ipt -N cali-to-wl-dispatch
ipt -N cali-fw-caliweb
ipt -N cali-tw-caliweb
ipt -N cali-pi-allow-http
ipt -I FORWARD -m comment --comment "cali:wUHhoiAYhphO9Mso" -j cali-FORWARD
ipt -A cali-FORWARD -m comment --comment "cali:vjrMJCRpqwy5oRoX" -j MARK --set-xmark 0x0/0xe0000
ipt -A cali-FORWARD -i cali+ -m comment --comment "cali:8ZoYfO5HKXWbB3pk" -j cali-from-wl-dispatch
ipt -A cali-from-wl-dispatch -i caliweb -m comment --comment "cali:from-web" -g cali-fw-caliweb
ipt -A cali-from-wl-dispatch -i cali+ -m comment --comment "cali:unknown-from" -j DROP
ipt -A cali-fw-caliweb -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
ipt -A cali-fw-caliweb -m conntrack --ctstate INVALID -j DROP
ipt -A cali-fw-caliweb -j MARK --set-xmark 0x10000/0x10000
ipt -A cali-FORWARD -o cali+ -m comment --comment "cali:to-wl" -j cali-to-wl-dispatch
ipt -A cali-to-wl-dispatch -o caliweb -m comment --comment "cali:to-web" -g cali-tw-caliweb
ipt -A cali-to-wl-dispatch -o cali+ -m comment --comment "cali:unknown-to" -j DROP
ipt -A cali-tw-caliweb -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
ipt -A cali-tw-caliweb -m conntrack --ctstate INVALID -j DROP
ipt -A cali-tw-caliweb -j MARK --set-xmark 0x0/0x20000
ipt -A cali-tw-caliweb -j cali-pi-allow-http
ipt -A cali-tw-caliweb -m mark --mark 0x10000/0x10000 -j RETURN
ipt -A cali-tw-caliweb -m comment --comment "cali:default-deny" -j DROP
ipt -A cali-pi-allow-http -p tcp -m tcp --dport 80 -j MARK --set-xmark 0x10000/0x10000
ipt -A cali-FORWARD -m mark --mark 0x10000/0x10000 -m comment --comment "cali:policy-accept" -j ACCEPT
