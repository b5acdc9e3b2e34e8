package nftdata

import "strconv"

// protocols are the inet_proto values nft names, as /etc/protocols does: the first
// name of each number is the one nft prints, the others are accepted aliases.
var protocols = []constant{
	{"hopopt", 0}, {"icmp", 1}, {"igmp", 2}, {"ipencap", 4}, {"tcp", 6}, {"egp", 8},
	{"udp", 17}, {"dccp", 33}, {"ipv6", 41}, {"ipv6-route", 43}, {"ipv6-frag", 44},
	{"rsvp", 46}, {"gre", 47}, {"esp", 50}, {"ah", 51}, {"ipv6-icmp", 58}, {"icmpv6", 58},
	{"ipv6-nonxt", 59}, {"ipv6-opts", 60}, {"ospf", 89}, {"ipip", 94}, {"pim", 103},
	{"vrrp", 112}, {"l2tp", 115}, {"sctp", 132}, {"udplite", 136}, {"mpls-in-ip", 137},
}

// ProtocolNumber returns the IP protocol number nft accepts name for (tcp 6, udp 17,
// sctp 132, icmp 1, icmpv6 and ipv6-icmp 58, ...), and false for an unknown name.
func ProtocolNumber(name string) (uint8, bool) {
	v, ok := InetProto.byName[name]
	return uint8(v), ok
}

// ProtocolName returns the name nft prints for IP protocol number n (ipv6-icmp for
// 58), or n in decimal when it has none.
func ProtocolName(n uint8) string {
	if name, ok := InetProto.byValue[uint64(n)]; ok {
		return name
	}
	return strconv.Itoa(int(n))
}
