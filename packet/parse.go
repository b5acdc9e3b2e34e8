package packet

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// ParseError is the error Parse returns: what was wrong, and where.
type ParseError struct {
	// Column is the 1-based byte column of the offending token (one past the end of
	// the input when something is missing).
	Column int
	// Token is the offending token; empty at the end of the input.
	Token string
	// Msg describes the problem, including the quoted token.
	Msg string
}

// Error returns "column N: message".
func (e *ParseError) Error() string {
	return fmt.Sprintf("column %d: %s", e.Column, e.Msg)
}

type token struct {
	text string
	col  int // 1-based
}

func tokenize(s string) []token {
	var toks []token
	i := 0
	for i < len(s) {
		if isSpace(s[i]) {
			i++
			continue
		}
		start := i
		for i < len(s) && !isSpace(s[i]) {
			i++
		}
		toks = append(toks, token{text: s[start:i], col: start + 1})
	}
	return toks
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// Parse reads a packet in its text form:
//
//	PROTO SRC -> DST [iif NAME] [oif NAME] [mark N] [ct STATE] [flags FLAGS] [type TYPE [code CODE]]
//
// PROTO is tcp, udp, sctp, icmp or icmpv6. SRC and DST are ADDR:PORT
// (`10.0.0.5:40000`, `[fd00::5]:53000`) for protocols with ports and a bare ADDR for
// icmp and icmpv6. Each trailing attribute appears at most once, in any order; mark
// is decimal or 0x-hex; STATE is new, established, related, invalid or untracked.
// flags (tcp only) are nft's flag names joined by commas (`syn,ack`, `rst`); type and
// code (icmp and icmpv6 only) are nft's names (`echo-reply`, `nd-router-advert`,
// `port-unreachable`) or numbers.
// Errors are *ParseError.
func Parse(s string) (Packet, error) {
	toks := tokenize(s)
	end := len(s) + 1
	errAt := func(i int, format string, args ...any) error {
		if i >= len(toks) {
			return &ParseError{Column: end, Msg: fmt.Sprintf(format, args...)}
		}
		return &ParseError{Column: toks[i].col, Token: toks[i].text, Msg: fmt.Sprintf(format, args...)}
	}
	var p Packet
	if len(toks) == 0 {
		return p, errAt(0, "empty packet, expected a protocol")
	}
	proto, err := ParseProtocol(toks[0].text)
	if err != nil {
		return p, errAt(0, "unknown protocol %q", toks[0].text)
	}
	p.Protocol = proto
	if len(toks) < 2 {
		return p, errAt(1, "expected a source address, found end of input")
	}
	if p.Src, err = parseEndpoint(toks[1].text, proto); err != nil {
		return p, errAt(1, "source %q: %v", toks[1].text, err)
	}
	if len(toks) < 3 || toks[2].text != "->" {
		if len(toks) < 3 {
			return p, errAt(2, `expected "->", found end of input`)
		}
		return p, errAt(2, `expected "->", found %q`, toks[2].text)
	}
	if len(toks) < 4 {
		return p, errAt(3, "expected a destination address, found end of input")
	}
	if p.Dst, err = parseEndpoint(toks[3].text, proto); err != nil {
		return p, errAt(3, "destination %q: %v", toks[3].text, err)
	}
	if p.Src.Addr().Is4() != p.Dst.Addr().Is4() {
		return p, errAt(3, "destination %q is not of the source's family", toks[3].text)
	}
	if proto == ICMP && !p.Src.Addr().Is4() {
		return p, errAt(0, `protocol "icmp" needs IPv4 addresses (use icmpv6)`)
	}
	if proto == ICMPv6 && p.Src.Addr().Is4() {
		return p, errAt(0, `protocol "icmpv6" needs IPv6 addresses (use icmp)`)
	}
	seen := map[string]bool{}
	for i := 4; i < len(toks); i += 2 {
		key := toks[i].text
		switch key {
		case "iif", "oif", "mark", "ct":
		case "flags":
			if proto != TCP {
				return p, errAt(i, "attribute \"flags\" is for tcp only")
			}
		case "type", "code":
			if proto != ICMP && proto != ICMPv6 {
				return p, errAt(i, "attribute %q is for icmp and icmpv6 only", key)
			}
			if key == "code" && !seen["type"] {
				return p, errAt(i, "attribute \"code\" needs a type before it")
			}
		default:
			return p, errAt(i, "unknown attribute %q (want iif, oif, mark, ct, flags, type or code)", key)
		}
		if seen[key] {
			return p, errAt(i, "attribute %q given twice", key)
		}
		seen[key] = true
		if i+1 >= len(toks) {
			return p, errAt(i+1, "attribute %q needs a value, found end of input", key)
		}
		val := toks[i+1].text
		switch key {
		case "iif", "oif":
			if err := validIfName(val); err != nil {
				return p, errAt(i+1, "%v", err)
			}
			if key == "iif" {
				p.IIf = val
			} else {
				p.OIf = val
			}
		case "mark":
			m, err := strconv.ParseUint(val, 0, 32)
			if err != nil {
				return p, errAt(i+1, "bad mark %q (want a 32-bit number)", val)
			}
			p.Mark = uint32(m)
		case "ct":
			st, err := ParseCTState(val)
			if err != nil {
				return p, errAt(i+1, "unknown conntrack state %q", val)
			}
			p.CT = st
		case "flags":
			f, err := ParseTCPFlags(val)
			if err != nil || f == 0 {
				return p, errAt(i+1, "bad tcp flags %q (want names such as syn,ack)", val)
			}
			p.Flags = f
		case "type":
			v, ok := lookup(ICMPTypeNames(proto), val)
			if !ok {
				return p, errAt(i+1, "unknown %s type %q", proto, val)
			}
			p.ICMP = ICMPMessage{Set: true, Type: v}
		case "code":
			v, ok := lookup(ICMPCodeNames(proto), val)
			if !ok {
				return p, errAt(i+1, "unknown %s code %q", proto, val)
			}
			p.ICMP.Code = v
		}
	}
	return p, nil
}

// MustParse is Parse that panics on error, for tests and constants.
func MustParse(s string) Packet {
	p, err := Parse(s)
	if err != nil {
		panic(fmt.Sprintf("packet.MustParse(%q): %v", s, err))
	}
	return p
}

func parseEndpoint(s string, proto Protocol) (netip.AddrPort, error) {
	if !proto.HasPorts() {
		a := strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
		addr, err := netip.ParseAddr(a)
		if err != nil {
			if _, perr := netip.ParseAddrPort(s); perr == nil {
				return netip.AddrPort{}, fmt.Errorf("%s has no ports", proto)
			}
			return netip.AddrPort{}, fmt.Errorf("bad address")
		}
		if addr.Zone() != "" {
			return netip.AddrPort{}, fmt.Errorf("zones are not supported")
		}
		return netip.AddrPortFrom(addr, 0), nil
	}
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		if _, aerr := netip.ParseAddr(strings.Trim(s, "[]")); aerr == nil {
			return netip.AddrPort{}, fmt.Errorf("missing port (%s needs ADDR:PORT)", proto)
		}
		return netip.AddrPort{}, fmt.Errorf("bad ADDR:PORT")
	}
	if ap.Addr().Zone() != "" {
		return netip.AddrPort{}, fmt.Errorf("zones are not supported")
	}
	return ap, nil
}
