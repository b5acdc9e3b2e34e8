#!/bin/sh
# Docker's and kube-proxy's (iptables mode) rules as iptables-nft writes them. Run in a
# throwaway network namespace, then `nft list ruleset` is iptables-nft.list.nft:
#
#	unshare -n sh -c 'sh iptables-nft.sh && nft list ruleset' > iptables-nft.list.nft
set -e
ipt() { iptables-nft -w "$@"; }

# Docker (bridge docker0, 172.17.0.0/16; a container publishing 8080 -> 172.17.0.2:80)
ipt -t nat -N DOCKER
ipt -t nat -A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER
ipt -t nat -A OUTPUT ! -d 127.0.0.0/8 -m addrtype --dst-type LOCAL -j DOCKER
ipt -t nat -A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE
ipt -t nat -A DOCKER -i docker0 -j RETURN
ipt -t nat -A DOCKER ! -i docker0 -p tcp -m tcp --dport 8080 -j DNAT --to-destination 172.17.0.2:80
ipt -N DOCKER
ipt -N DOCKER-ISOLATION-STAGE-1
ipt -N DOCKER-ISOLATION-STAGE-2
ipt -N DOCKER-USER
ipt -P FORWARD DROP
ipt -A FORWARD -j DOCKER-USER
ipt -A FORWARD -j DOCKER-ISOLATION-STAGE-1
ipt -A FORWARD -o docker0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
ipt -A FORWARD -o docker0 -j DOCKER
ipt -A FORWARD -i docker0 ! -o docker0 -j ACCEPT
ipt -A FORWARD -i docker0 -o docker0 -j ACCEPT
ipt -A DOCKER -d 172.17.0.2/32 ! -i docker0 -o docker0 -p tcp -m tcp --dport 80 -j ACCEPT
ipt -A DOCKER-ISOLATION-STAGE-1 -i docker0 ! -o docker0 -j DOCKER-ISOLATION-STAGE-2
ipt -A DOCKER-ISOLATION-STAGE-1 -j RETURN
ipt -A DOCKER-ISOLATION-STAGE-2 -o docker0 -j DROP
ipt -A DOCKER-ISOLATION-STAGE-2 -j RETURN
ipt -A DOCKER-USER -j RETURN

# kube-proxy, iptables mode (cluster CIDR 10.0.0.0/8; Service 172.30.0.10:80 with two
# endpoints, NodePort 30080; Service 172.30.0.11:80 without endpoints)
ipt -t nat -N KUBE-SERVICES
ipt -t nat -N KUBE-NODEPORTS
ipt -t nat -N KUBE-POSTROUTING
ipt -t nat -N KUBE-MARK-MASQ
ipt -t nat -N KUBE-SVC-WEB
ipt -t nat -N KUBE-EXT-WEB
ipt -t nat -N KUBE-SEP-A
ipt -t nat -N KUBE-SEP-B
ipt -t nat -I PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
ipt -t nat -I OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
ipt -t nat -I POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
ipt -t nat -A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
ipt -t nat -A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
ipt -t nat -A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0
ipt -t nat -A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
ipt -t nat -A KUBE-SERVICES -d 172.30.0.10/32 -p tcp -m comment --comment "default/web:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-WEB
ipt -t nat -A KUBE-SERVICES -m comment --comment "kubernetes service nodeports" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
ipt -t nat -A KUBE-NODEPORTS -p tcp -m comment --comment "default/web:http" -m tcp --dport 30080 -j KUBE-EXT-WEB
ipt -t nat -A KUBE-EXT-WEB -m comment --comment "masquerade traffic for default/web:http external destinations" -j KUBE-MARK-MASQ
ipt -t nat -A KUBE-EXT-WEB -j KUBE-SVC-WEB
ipt -t nat -A KUBE-SVC-WEB ! -s 10.0.0.0/8 -d 172.30.0.10/32 -p tcp -m comment --comment "default/web:http cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
ipt -t nat -A KUBE-SVC-WEB -m comment --comment "default/web:http -> 10.1.0.5:8080" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-A
ipt -t nat -A KUBE-SVC-WEB -m comment --comment "default/web:http -> 10.2.0.5:8080" -j KUBE-SEP-B
ipt -t nat -A KUBE-SEP-A -s 10.1.0.5/32 -m comment --comment "default/web:http" -j KUBE-MARK-MASQ
ipt -t nat -A KUBE-SEP-A -p tcp -m comment --comment "default/web:http" -m tcp -j DNAT --to-destination 10.1.0.5:8080
ipt -t nat -A KUBE-SEP-B -s 10.2.0.5/32 -m comment --comment "default/web:http" -j KUBE-MARK-MASQ
ipt -t nat -A KUBE-SEP-B -p tcp -m comment --comment "default/web:http" -m tcp -j DNAT --to-destination 10.2.0.5:8080
ipt -N KUBE-FIREWALL
ipt -N KUBE-SERVICES
ipt -N KUBE-FORWARD
ipt -N KUBE-PROXY-FIREWALL
ipt -I INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
ipt -I INPUT -j KUBE-FIREWALL
ipt -I OUTPUT -j KUBE-FIREWALL
ipt -I FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
ipt -I FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
ipt -A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
ipt -A KUBE-SERVICES -d 172.30.0.11/32 -p tcp -m comment --comment "default/empty:http has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable
ipt -A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
ipt -A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
ipt -A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT

# What a node's own additions often look like: an SSH rate limit (limit), a bridge
# match and a checksum fix iptables-nft can only keep as xt expressions, ping and MSS
# clamping.
ipt -A INPUT -p tcp -m tcp --dport 22 -m conntrack --ctstate NEW -m limit --limit 10/min -j ACCEPT
ipt -A INPUT -p tcp -m tcp --dport 22 -m conntrack --ctstate NEW -j DROP
ipt -A INPUT -p icmp -m icmp --icmp-type 8 -j ACCEPT
ipt -I FORWARD -m physdev --physdev-is-bridged -j ACCEPT
ipt -t mangle -A POSTROUTING -o docker0 -p udp -m udp --dport 68 -j CHECKSUM --checksum-fill
ipt -t mangle -A FORWARD -p tcp -m tcp --tcp-flags SYN,RST SYN -j TCPMSS --clamp-mss-to-pmtu
