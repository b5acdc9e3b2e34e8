package sim

import (
	"strings"

	"github.com/nftproxy/nftproxy/packet"
)

// socketStmts parse the statements of this file, and meters, by their keyword.
var socketStmts = map[string]func(*ruleParser) (stmt, error){
	"tproxy":   (*ruleParser).parseTProxy,
	"synproxy": (*ruleParser).parseSynproxy,
	"osf":      (*ruleParser).parseOSF,
	"dup":      (*ruleParser).parseDup,
	"fwd":      (*ruleParser).parseFwd,
	"meter":    (*ruleParser).parseMeter,
}

// tproxyStmt is "tproxy [ip|ip6] to [ADDR][:PORT]": it assigns the packet to a
// transparent socket listening there, or ends the rule when there is none. Whether
// one listens is the node's, not the packet's: the trace forks. With a socket, the
// packet goes on (its mark set, usually) and, as the policy routing tproxy setups
// add (ip rule fwmark ... lookup ...; local default dev lo), is delivered locally.
type tproxyStmt struct {
	fam      packet.Family // 0: the table's (inet: any)
	to       string
	txt      string
	outcomes [2]string
}

func (s *tproxyStmt) String() string { return s.txt }

func (s *tproxyStmt) exec(c *evalCtx) (result, *verdict) {
	st := c.st
	if (st.proto != packet.TCP && st.proto != packet.UDP) || (s.fam != 0 && s.fam != st.fam) {
		return rBreak, nil
	}
	if c.fork(s.txt, s.outcomes) == 1 {
		return rBreak, nil
	}
	st.tproxy = s.to
	return rNext, nil
}

// parseTProxy reads "tproxy [ip|ip6] to [ADDR][:PORT]".
func (rp *ruleParser) parseTProxy() (stmt, error) {
	start := rp.i
	kw := rp.next()
	s := &tproxyStmt{}
	switch {
	case rp.isWord(0, "ip"):
		rp.next()
		s.fam = packet.IPv4
	case rp.isWord(0, "ip6"):
		rp.next()
		s.fam = packet.IPv6
	}
	if _, err := rp.expectWord("to"); err != nil {
		return nil, err
	}
	to := rp.next()
	if to.kind != tWord {
		return nil, errAt(to, "expected tproxy's ADDR[:PORT], found %s", to.show())
	}
	if err := rp.allowFork(kw, "tproxy", "whether a transparent socket listens there"); err != nil {
		return nil, err
	}
	s.to = to.text
	where := "on " + to.text
	if strings.HasPrefix(to.text, ":") {
		where = "on port " + to.text[1:]
	}
	s.txt = rp.textFrom(start)
	s.outcomes = [2]string{"a transparent socket listens " + where, "no socket listens " + where}
	return s, nil
}

// synproxyStmt is "synproxy [mss N] [wscale N] [timestamp] [sack-perm]" or "synproxy
// name NAME". It answers a SYN itself (a SYN-ACK with a cookie), and an ACK with a
// valid cookie by opening the connection to the server; either way the packet goes
// no further, and an ACK without a valid cookie is dropped. Other TCP segments go on.
type synproxyStmt struct{ txt string }

func (s *synproxyStmt) String() string { return s.txt }

func (s *synproxyStmt) exec(c *evalCtx) (result, *verdict) {
	if c.st.proto != packet.TCP {
		return rBreak, nil
	}
	flags, _ := (&tcpFlagsExpr{}).eval(c, nil)
	switch {
	case flags[0]&packet.FlagSYN != 0:
		c.note("synproxy answers the SYN with a SYN-ACK carrying a cookie; the SYN goes no further")
	case flags[0]&packet.FlagACK != 0:
		c.note("synproxy: an ACK with a valid cookie makes it open the connection to the server, any other ACK is dropped; the ACK goes no further")
	default:
		return rNext, nil
	}
	return rVerdict, dropVerdict
}

// parseSynproxy reads the synproxy statement's options.
func (rp *ruleParser) parseSynproxy() (stmt, error) {
	start := rp.i
	rp.next()
	for !rp.atEnd() {
		switch {
		case rp.isWord(0, "mss"), rp.isWord(0, "wscale"), rp.isWord(0, "name"):
			rp.next()
			rp.next()
		case rp.isWord(0, "timestamp"), rp.isWord(0, "sack-perm"):
			rp.next()
		default:
			return &synproxyStmt{txt: rp.textFrom(start)}, nil
		}
	}
	return &synproxyStmt{txt: rp.textFrom(start)}, nil
}

// osfStmt is a match on the operating system that sent a TCP SYN ("osf [ttl
// loose|skip] name|version VALUE"). The fingerprint is in the SYN's options and
// window, which the simulator's packets do not spell out, and needs the kernel's
// fingerprint list (nfnl_osf): the trace forks for a SYN. Nothing else matches.
type osfStmt struct{ fork *forkStmt }

func (s *osfStmt) String() string { return s.fork.txt }

func (s *osfStmt) exec(c *evalCtx) (result, *verdict) {
	flags, ok := (&tcpFlagsExpr{}).eval(c, nil)
	if !ok || flags[0]&(packet.FlagSYN|packet.FlagACK) != packet.FlagSYN {
		c.note("osf fingerprints only TCP SYNs")
		return rBreak, nil
	}
	return s.fork.exec(c)
}

// parseOSF reads "osf [ttl loose|skip|global] name|version [OP] VALUE".
func (rp *ruleParser) parseOSF() (stmt, error) {
	start := rp.i
	kw := rp.next()
	if rp.isWord(0, "ttl") {
		rp.next()
		rp.next()
	}
	if k := rp.next(); k.kind != tWord || (k.text != "name" && k.text != "version") {
		return nil, errAt(k, "expected name or version after osf, found %s", k.show())
	}
	if err := rp.allowFork(kw, "osf", "the operating system's fingerprint in the SYN"); err != nil {
		return nil, err
	}
	m, err := rp.forkMatch(start, kw)
	if err != nil {
		return nil, err
	}
	return &osfStmt{fork: m.(*forkStmt)}, nil
}

// dupStmt is "dup to ADDR [device DEV]" (and "dup to DEV" in netdev tables): a copy
// of the packet is sent there, the packet itself goes on unchanged.
type dupStmt struct {
	to  string
	txt string
}

func (s *dupStmt) String() string { return s.txt }

func (s *dupStmt) exec(c *evalCtx) (result, *verdict) {
	c.note("a copy of the packet is sent to " + s.to + "; the packet goes on")
	return rNext, nil
}

// parseDup reads "dup to ADDR [device DEV]".
func (rp *ruleParser) parseDup() (stmt, error) {
	start := rp.i
	rp.next()
	if _, err := rp.expectWord("to"); err != nil {
		return nil, err
	}
	to := rp.next()
	if to.kind != tWord && to.kind != tString {
		return nil, errAt(to, "expected dup's destination, found %s", to.show())
	}
	s := &dupStmt{to: to.text}
	if rp.isWord(0, "device") {
		rp.next()
		s.to += " via " + rp.next().text
	}
	s.txt = rp.textFrom(start)
	return s, nil
}

// fwdStmt is "fwd to DEV" or "fwd [ip|ip6] to ADDR device DEV" in a netdev ingress
// chain: the packet leaves by DEV as it is, past the IP hooks.
type fwdStmt struct {
	dev string
	txt string
}

func (s *fwdStmt) String() string { return s.txt }

func (s *fwdStmt) exec(c *evalCtx) (result, *verdict) {
	return rVerdict, &verdict{kind: vStolen, chainName: s.dev}
}

// parseFwd reads "fwd to DEV" and "fwd [ip|ip6] to ADDR device DEV".
func (rp *ruleParser) parseFwd() (stmt, error) {
	start := rp.i
	kw := rp.next()
	if rp.tab.family != "netdev" {
		return nil, errAt(kw, "fwd is only for netdev tables")
	}
	if rp.isWord(0, "ip") || rp.isWord(0, "ip6") {
		rp.next()
	}
	if _, err := rp.expectWord("to"); err != nil {
		return nil, err
	}
	to := rp.next()
	if rp.isWord(0, "device") {
		rp.next()
		to = rp.next()
	}
	if to.kind != tWord && to.kind != tString {
		return nil, errAt(to, "expected fwd's device, found %s", to.show())
	}
	return &fwdStmt{dev: to.text, txt: rp.textFrom(start)}, nil
}
