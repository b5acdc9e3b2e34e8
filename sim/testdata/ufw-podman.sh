#!/bin/sh
# ufw (default deny incoming and routed; allow 22/tcp, limit 2222/tcp) as
# iptables-nft writes its rules, and Podman's netavark (nftables driver: bridge
# podman0 10.88.0.0/16, a container publishing 8080 -> 10.88.0.2:80) beside it.
# Run in a throwaway network namespace, then `nft list ruleset` is
# ufw-podman.list.nft:
#
#	unshare -n sh -c 'sh ufw-podman.sh && nft list ruleset' > ufw-podman.list.nft
set -e
ipt() { iptables-nft -w "$@"; }
for c in before-logging-input before-input after-input after-logging-input reject-input track-input \
	before-logging-forward before-forward after-forward after-logging-forward reject-forward track-forward \
	before-logging-output before-output after-output after-logging-output reject-output track-output \
	not-local logging-deny logging-allow skip-to-policy-input skip-to-policy-forward \
	user-input user-forward user-output user-limit user-limit-accept; do
	ipt -N ufw-$c
done
ipt -P INPUT DROP
ipt -P FORWARD DROP
for h in input forward output; do
	H=$(echo $h | tr a-z A-Z)
	for c in before-logging before after after-logging reject track; do
		ipt -A $H -j ufw-$c-$h
	done
done
ipt -A ufw-before-input -i lo -j ACCEPT
ipt -A ufw-before-input -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
ipt -A ufw-before-input -m conntrack --ctstate INVALID -j ufw-logging-deny
ipt -A ufw-before-input -m conntrack --ctstate INVALID -j DROP
for t in destination-unreachable time-exceeded parameter-problem echo-request; do
	ipt -A ufw-before-input -p icmp --icmp-type $t -j ACCEPT
done
ipt -A ufw-before-input -p udp --sport 67 --dport 68 -j ACCEPT
ipt -A ufw-before-input -j ufw-not-local
ipt -A ufw-before-input -d 224.0.0.251/32 -p udp --dport 5353 -j ACCEPT
ipt -A ufw-before-input -j ufw-user-input
ipt -A ufw-not-local -m addrtype --dst-type LOCAL -j RETURN
ipt -A ufw-not-local -m addrtype --dst-type MULTICAST -j RETURN
ipt -A ufw-not-local -m addrtype --dst-type BROADCAST -j RETURN
ipt -A ufw-not-local -m limit --limit 3/min --limit-burst 10 -j ufw-logging-deny
ipt -A ufw-not-local -j DROP
ipt -A ufw-logging-deny -m conntrack --ctstate INVALID -m limit --limit 3/min --limit-burst 10 -j RETURN
ipt -A ufw-logging-deny -m limit --limit 3/min --limit-burst 10 -j LOG --log-prefix "[UFW BLOCK] "
ipt -A ufw-after-input -p udp --dport 137 -j ufw-skip-to-policy-input
ipt -A ufw-after-input -m addrtype --dst-type BROADCAST -j ufw-skip-to-policy-input
ipt -A ufw-after-logging-input -m limit --limit 3/min --limit-burst 10 -j LOG --log-prefix "[UFW BLOCK] "
ipt -A ufw-skip-to-policy-input -j DROP
ipt -A ufw-user-input -p tcp --dport 22 -j ACCEPT
ipt -A ufw-user-input -p tcp --dport 2222 -m conntrack --ctstate NEW -m recent --set --name DEFAULT --mask 255.255.255.255 --rsource
ipt -A ufw-user-input -p tcp --dport 2222 -m conntrack --ctstate NEW -m recent --update --seconds 30 --hitcount 6 --name DEFAULT --mask 255.255.255.255 --rsource -j ufw-user-limit
ipt -A ufw-user-input -p tcp --dport 2222 -j ufw-user-limit-accept
ipt -A ufw-user-limit -m limit --limit 3/minute -j LOG --log-prefix "[UFW LIMIT BLOCK] "
ipt -A ufw-user-limit -j REJECT
ipt -A ufw-user-limit-accept -j ACCEPT
ipt -A ufw-before-forward -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
ipt -A ufw-before-forward -p icmp --icmp-type echo-request -j ACCEPT
ipt -A ufw-before-forward -j ufw-user-forward
ipt -A ufw-after-logging-forward -m limit --limit 3/min --limit-burst 10 -j LOG --log-prefix "[UFW BLOCK] "
ipt -A ufw-before-output -o lo -j ACCEPT
ipt -A ufw-before-output -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
ipt -A ufw-before-output -j ufw-user-output
ipt -A ufw-track-output -p tcp -m conntrack --ctstate NEW -j ACCEPT
ipt -A ufw-track-output -p udp -m conntrack --ctstate NEW -j ACCEPT

nft -f - <<'NFT'
table inet netavark {
	chain INPUT {
		type filter hook input priority filter; policy accept;
		ip saddr 10.88.0.0/16 meta l4proto { tcp, udp } th dport 53 accept
	}
	chain FORWARD {
		type filter hook forward priority filter; policy accept;
		ct state invalid drop
		jump NETAVARK-ISOLATION-1
		ip daddr 10.88.0.0/16 ct state established,related accept
		ip saddr 10.88.0.0/16 accept
	}
	chain POSTROUTING {
		type nat hook postrouting priority srcnat; policy accept;
		meta mark & 0x2000 == 0x2000 meta mark set meta mark & 0xffffdfff masquerade
		ip saddr 10.88.0.0/16 jump nv_2f259bab_10_88_0_0_nm16
	}
	chain PREROUTING {
		type nat hook prerouting priority dstnat; policy accept;
		fib daddr type local jump NETAVARK-HOSTPORT-DNAT
	}
	chain OUTPUT {
		type nat hook output priority -100; policy accept;
		fib daddr type local jump NETAVARK-HOSTPORT-DNAT
	}
	chain NETAVARK-HOSTPORT-DNAT {
		tcp dport 8080 jump nv_2f259bab_10_88_0_0_nm16_dnat
	}
	chain NETAVARK-HOSTPORT-SETMARK {
		meta mark set meta mark | 0x2000
	}
	chain NETAVARK-ISOLATION-1 {
	}
	chain NETAVARK-ISOLATION-3 {
		oifname "podman0" drop
	}
	chain nv_2f259bab_10_88_0_0_nm16 {
		ip daddr 10.88.0.0/16 accept
		ip daddr != 224.0.0.0/4 masquerade
	}
	chain nv_2f259bab_10_88_0_0_nm16_dnat {
		ip saddr 10.88.0.0/16 tcp dport 8080 jump NETAVARK-HOSTPORT-SETMARK
		ip saddr 127.0.0.1 tcp dport 8080 jump NETAVARK-HOSTPORT-SETMARK
		tcp dport 8080 dnat ip to 10.88.0.2:80
	}
}
NFT
