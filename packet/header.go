package packet

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// TCP header flags, as nft names them.
const (
	FlagFIN uint8 = 0x01
	FlagSYN uint8 = 0x02
	FlagRST uint8 = 0x04
	FlagPSH uint8 = 0x08
	FlagACK uint8 = 0x10
	FlagURG uint8 = 0x20
	FlagECN uint8 = 0x40
	FlagCWR uint8 = 0x80
)

var tcpFlagNames = []string{"fin", "syn", "rst", "psh", "ack", "urg", "ecn", "cwr"}

// TCPFlagNames maps nft's names of the TCP flags to their bits.
func TCPFlagNames() map[string]uint8 {
	m := map[string]uint8{}
	for i, n := range tcpFlagNames {
		m[n] = 1 << i
	}
	return m
}

// FormatTCPFlags renders flags as nft does: names joined by commas ("syn,ack").
func FormatTCPFlags(f uint8) string {
	var names []string
	for i, n := range tcpFlagNames {
		if f&(1<<i) != 0 {
			names = append(names, n)
		}
	}
	return strings.Join(names, ",")
}

// ParseTCPFlags reads flags written as FormatTCPFlags writes them, or a number.
func ParseTCPFlags(s string) (uint8, error) {
	if v, err := strconv.ParseUint(s, 0, 8); err == nil {
		return uint8(v), nil
	}
	names := TCPFlagNames()
	var f uint8
	for _, n := range strings.Split(s, ",") {
		b, ok := names[n]
		if !ok {
			return 0, fmt.Errorf("unknown tcp flag %q (want fin, syn, rst, psh, ack, urg, ecn, cwr)", n)
		}
		f |= b
	}
	return f, nil
}

// ICMPMessage is the type and code of an ICMP or ICMPv6 message.
type ICMPMessage struct {
	// Set says the message was given; the zero value stands for an echo request (an
	// echo reply in the reply direction of a connection).
	Set        bool
	Type, Code uint8
}

// ICMP and ICMPv6 message types and codes, by nft's names.
var (
	icmpTypes = map[string]uint8{
		"echo-reply": 0, "destination-unreachable": 3, "source-quench": 4, "redirect": 5,
		"echo-request": 8, "router-advertisement": 9, "router-solicitation": 10,
		"time-exceeded": 11, "parameter-problem": 12, "timestamp-request": 13,
		"timestamp-reply": 14, "info-request": 15, "info-reply": 16,
		"address-mask-request": 17, "address-mask-reply": 18,
	}
	icmpv6Types = map[string]uint8{
		"destination-unreachable": 1, "packet-too-big": 2, "time-exceeded": 3,
		"parameter-problem": 4, "echo-request": 128, "echo-reply": 129,
		"mld-listener-query": 130, "mld-listener-report": 131, "mld-listener-done": 132,
		"mld-listener-reduction": 132, "nd-router-solicit": 133, "nd-router-advert": 134,
		"nd-neighbor-solicit": 135, "nd-neighbor-advert": 136, "nd-redirect": 137,
		"router-renumbering": 138, "ind-neighbor-solicit": 141, "ind-neighbor-advert": 142,
		"mld2-listener-report": 143,
	}
	icmpCodes = map[string]uint8{
		"net-unreachable": 0, "host-unreachable": 1, "prot-unreachable": 2,
		"port-unreachable": 3, "frag-needed": 4, "net-prohibited": 9, "host-prohibited": 10,
		"admin-prohibited": 13,
	}
	icmpv6Codes = map[string]uint8{
		"no-route": 0, "admin-prohibited": 1, "addr-unreachable": 3, "port-unreachable": 4,
		"policy-fail": 5, "reject-route": 6,
	}
)

// ICMPTypeNames maps nft's names of the message types of p (ICMP or ICMPv6) to their
// numbers; ICMPCodeNames does the same for the codes of destination-unreachable.
func ICMPTypeNames(p Protocol) map[string]uint8 {
	if p == ICMPv6 {
		return clone(icmpv6Types)
	}
	return clone(icmpTypes)
}

// ICMPCodeNames maps nft's names of the ICMP or ICMPv6 codes to their numbers.
func ICMPCodeNames(p Protocol) map[string]uint8 {
	if p == ICMPv6 {
		return clone(icmpv6Codes)
	}
	return clone(icmpCodes)
}

func clone(m map[string]uint8) map[string]uint8 {
	out := make(map[string]uint8, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// name returns the first name (alphabetically) of v in m, or its number.
func name(m map[string]uint8, v uint8) string {
	var names []string
	for n, x := range m {
		if x == v {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return strconv.Itoa(int(v))
	}
	sort.Strings(names)
	return names[0]
}

func lookup(m map[string]uint8, s string) (uint8, bool) {
	if v, ok := m[s]; ok {
		return v, true
	}
	v, err := strconv.ParseUint(s, 0, 8)
	return uint8(v), err == nil
}
