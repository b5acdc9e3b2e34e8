package sim

import (
	"strconv"
	"strings"
)

// forkStmt is a statement whose outcome the packet cannot decide (limit rate, quota,
// ct count, an xt match or target, socket, meta time, ...): the trace follows both
// outcomes, each branch assuming one of them.
type forkStmt struct {
	txt string
	// outcomes are the assumptions of the branch where the match holds (or the
	// statement lets the packet go on) and of the one where it does not.
	outcomes [2]string
	// drop says the second outcome drops the packet instead of ending the rule (xt
	// target).
	drop bool
	// accept says the first outcome accepts the packet (queue: the program that
	// reads the queue says accept) instead of going on with the rule.
	accept bool
	// single says there is no second outcome: the statement is assumed to do what
	// outcomes[0] says (an xt target known not to change the packet's path).
	single bool
}

func (s *forkStmt) String() string { return s.txt }

func (s *forkStmt) exec(c *evalCtx) (result, *verdict) {
	if s.single {
		c.decide(Choice{Expr: s.txt, Mod: 1, Assumed: true, Outcome: s.outcomes[0]})
		c.note("assuming " + s.outcomes[0])
		return rNext, nil
	}
	if c.fork(s.txt, s.outcomes) == 0 {
		if s.accept {
			return rVerdict, acceptVerdict
		}
		return rNext, nil
	}
	if s.drop {
		return rVerdict, dropVerdict
	}
	return rBreak, nil
}

// randomStmt is a match on meta random that holds with a known probability, as
// iptables-nft writes the statistic match ("meta random & 2147483647 < 1073741824").
type randomStmt struct {
	txt string
	p   float64
}

func (s *randomStmt) String() string { return s.txt }

func (s *randomStmt) exec(c *evalCtx) (result, *verdict) {
	if c.chance(s.txt, s.p) == 0 {
		return rNext, nil
	}
	return rBreak, nil
}

// undecidableMeta are the meta keys whose value a packet cannot show.
var undecidableMeta = map[string]string{
	"cpu": "the CPU that handles the packet", "time": "the time the packet arrives",
	"day": "the day the packet arrives", "hour": "the hour the packet arrives",
	"random": "a random number", "cgroup": "the sending socket's cgroup",
	"iifgroup": "the input interface's group", "oifgroup": "the output interface's group",
	"rtclassid": "the route's realm", "priority": "the packet's priority",
	"secpath": "IPsec state",
}

// allowFork returns nil when the program is compiled with forks, else the error that
// construct at t depends on what a packet cannot show (why).
func (rp *ruleParser) allowFork(t token, what, why string) error {
	if rp.p.opts.Forks {
		return nil
	}
	return errAt(t, "%s depends on %s, which a packet cannot show (CompileOptions.Forks follows both outcomes)", what, why)
}

// parseForkStmt reads limit, quota, ct count, xt, socket and the undecidable meta
// matches. It returns nil, nil when the statement at hand is none of them.
func (rp *ruleParser) parseForkStmt() (stmt, error) {
	start := rp.i
	t := rp.peek()
	switch {
	case t.text == "limit":
		return rp.parseLimit()
	case t.text == "quota":
		return rp.parseQuota()
	case t.text == "ct" && rp.isWord(1, "count"):
		rp.next()
		rp.next()
		over := false
		if rp.isWord(0, "over") {
			rp.next()
			over = true
		}
		n := rp.next()
		if _, err := strconv.ParseUint(n.text, 10, 32); err != nil || n.kind != tWord {
			return nil, errAt(n, "bad ct count %s", n.show())
		}
		if err := rp.allowFork(t, "ct count", "the number of connections tracked"); err != nil {
			return nil, err
		}
		txt := rp.textFrom(start)
		at, above := "at most "+n.text+" connections counted", "more than "+n.text+" connections counted"
		if over {
			return &forkStmt{txt: txt, outcomes: [2]string{above, at}}, nil
		}
		return &forkStmt{txt: txt, outcomes: [2]string{at, above}}, nil
	case t.text == "xt":
		rp.next()
		k := rp.next()
		if k.kind != tWord || (k.text != "match" && k.text != "target" && k.text != "watcher") {
			return nil, errAt(k, "expected match, target or watcher after xt, found %s", k.show())
		}
		n := rp.next()
		if n.kind != tWord && n.kind != tString {
			return nil, errAt(n, "expected the xt %s's name, found %s", k.text, n.show())
		}
		if k.text == "match" && n.text == "comment" {
			// iptables' comment match holds for every packet.
			return &noopStmt{txt: rp.textFrom(start)}, nil
		}
		if err := rp.allowFork(t, "xt "+k.text+" "+strconv.Quote(n.text), "an iptables extension whose arguments nft does not show"); err != nil {
			return nil, err
		}
		txt := rp.textFrom(start)
		name := "xt " + k.text + " " + strconv.Quote(n.text)
		if does, ok := pathNeutralTargets[n.text]; ok && k.text == "target" {
			return &forkStmt{txt: txt, outcomes: [2]string{name + " lets the packet go on (it " + does + ")"}, single: true}, nil
		}
		if k.text == "match" {
			return &forkStmt{txt: txt, outcomes: [2]string{name + " matches", name + " does not match"}}, nil
		}
		return &forkStmt{txt: txt, outcomes: [2]string{name + " lets the packet go on", name + " drops the packet"}, drop: true}, nil
	case t.text == "ether" || t.text == "vlan" || t.text == "arp":
		rp.next()
		if k := rp.next(); k.kind != tWord {
			return nil, errAt(k, "expected a %s field, found %s", t.text, k.show())
		}
		if err := rp.allowFork(t, t.text, "the link layer header (MAC addresses, VLAN tags)"); err != nil {
			return nil, err
		}
		return rp.forkMatch(start, t)
	case exthdrs[t.text] && !rp.isWord(2, "set") && rp.peekAt(1).kind == tWord && !routeKeys[rp.peekAt(1).text]:
		rp.next()
		rp.next()
		m, err := rp.forkMatch(start, t)
		if err != nil {
			return nil, err
		}
		return &absentStmt{txt: m.String(), note: "the packet has no IPv6 " + t.text + " header"}, nil
	case t.text == "flow" && (rp.isWord(1, "add") || rp.isWord(1, "offload")):
		rp.next()
		rp.next()
		if ft := rp.next(); ft.kind != tWord || !strings.HasPrefix(ft.text, "@") {
			return nil, errAt(ft, "expected @flowtable, found %s", ft.show())
		}
		// Offloading affects the connection's later packets, not this one.
		return &noopStmt{txt: rp.textFrom(start)}, nil
	case t.text == "queue":
		rp.next()
		for !rp.atEnd() {
			n := rp.peek()
			if n.kind == tWord && (n.text == "num" || n.text == "to" || n.text == "flags") {
				rp.next()
				rp.next()
				for rp.peek().kind == tComma {
					rp.next()
					rp.next()
				}
				continue
			}
			if n.kind == tWord && (n.text == "bypass" || n.text == "fanout") {
				rp.next()
				continue
			}
			break
		}
		if err := rp.allowFork(t, "queue", "the verdict of the program reading the queue"); err != nil {
			return nil, err
		}
		txt := rp.textFrom(start)
		return &forkStmt{txt: txt, outcomes: [2]string{"the program reading " + txt + " accepts the packet", "the program reading " + txt + " drops the packet"}, accept: true, drop: true}, nil
	case t.text == "socket":
		rp.next()
		k := rp.next()
		if k.kind != tWord {
			return nil, errAt(k, "expected a socket key, found %s", k.show())
		}
		if rp.isWord(0, "level") {
			rp.next()
			rp.next()
		}
		if err := rp.allowFork(t, "socket "+k.text, "the socket the packet belongs to"); err != nil {
			return nil, err
		}
		return rp.forkMatch(start, t)
	case rp.isUndecidedTCPOption():
		return rp.parseTCPOptionFork(start, t)
	case t.text == "meta" && rp.isWord(2, "set"):
		// meta priority set, meta pkttype set: statements, not matches.
		return nil, nil
	case t.text == "meta" && rp.isWord(1, "random"):
		return rp.parseRandom()
	case t.text == "meta" && undecidableMeta[rp.peekAt(1).text] != "":
		rp.next()
		k := rp.next()
		if err := rp.allowFork(t, "meta "+k.text, undecidableMeta[k.text]); err != nil {
			return nil, err
		}
		return rp.forkMatch(start, t)
	}
	return nil, nil
}

// forkMatch reads the rest of a match whose left side (from start) the packet cannot
// decide: an optional operator and a value, a list of values or a set.
func (rp *ruleParser) forkMatch(start int, kw token) (stmt, error) {
	if n := rp.peek(); n.kind == tOp {
		rp.next()
	}
	v := rp.next()
	switch v.kind {
	case tLBrace:
		for depth := 1; depth > 0; {
			t := rp.next()
			switch t.kind {
			case tEOF:
				return nil, errAt(t, `expected "}", found end of rule`)
			case tLBrace:
				depth++
			case tRBrace:
				depth--
			}
		}
	case tWord, tString:
		for {
			n := rp.peek()
			switch {
			case n.kind == tComma:
				rp.next()
				rp.next()
				continue
			case n.kind == tWord && n.text == "-" && v.kind == tString:
				// A range of strings: meta hour "17:00"-"19:00".
				rp.next()
				rp.next()
				continue
			}
			break
		}
	default:
		return nil, errAt(v, "%s: expected a value, found %s", kw.text, v.show())
	}
	txt := rp.textFrom(start)
	return &forkStmt{txt: txt, outcomes: [2]string{txt + " holds", txt + " does not hold"}}, nil
}

var rateUnits = map[string]bool{"bytes": true, "kbytes": true, "mbytes": true, "gbytes": true, "packets": true}

// parseLimit reads "limit rate [over] N/UNIT [burst N packets|bytes]" (and N
// bytes/UNIT forms).
func (rp *ruleParser) parseLimit() (stmt, error) {
	start := rp.i
	kw := rp.next()
	if rp.isWord(0, "name") {
		rp.next()
		rp.next()
		if err := rp.allowFork(kw, "limit", "the rate of earlier packets"); err != nil {
			return nil, err
		}
		// The object says whether it matches under or over its rate.
		txt := rp.textFrom(start)
		return &forkStmt{txt: txt, outcomes: [2]string{txt + " matches", txt + " does not match"}}, nil
	}
	if _, err := rp.expectWord("rate"); err != nil {
		return nil, err
	}
	over := false
	if rp.isWord(0, "over") {
		rp.next()
		over = true
	}
	rateStart := rp.i
	r := rp.next()
	if r.kind != tWord || r.text == "" || r.text[0] < '0' || r.text[0] > '9' {
		return nil, errAt(r, "expected a rate, found %s", r.show())
	}
	if !strings.Contains(r.text, "/") {
		u := rp.next()
		if u.kind != tWord || !strings.Contains(u.text, "/") {
			return nil, errAt(u, "expected a rate unit (bytes/second, ...), found %s", u.show())
		}
	}
	if rp.isWord(0, "burst") {
		rp.next()
		rp.next()
		if n := rp.peek(); n.kind == tWord && rateUnits[n.text] {
			rp.next()
		}
	}
	if err := rp.allowFork(kw, "limit rate", "the rate of earlier packets"); err != nil {
		return nil, err
	}
	rate := "limit rate " + rp.textFrom(rateStart)
	o := [2]string{"under " + rate, "over " + rate}
	if over {
		o[0], o[1] = o[1], o[0]
	}
	return &forkStmt{txt: rp.textFrom(start), outcomes: o}, nil
}

// parseQuota reads "quota [over|until] N UNIT [used N UNIT]" and "quota name NAME".
func (rp *ruleParser) parseQuota() (stmt, error) {
	start := rp.i
	kw := rp.next()
	over := false
	named := rp.isWord(0, "name")
	if named {
		rp.next()
		rp.next()
	} else {
		switch {
		case rp.isWord(0, "over"):
			rp.next()
			over = true
		case rp.isWord(0, "until"):
			// "until" is the default mode (nft lists it without the word).
			rp.next()
		}
		n := rp.next()
		if _, err := strconv.ParseUint(n.text, 10, 64); err != nil || n.kind != tWord {
			return nil, errAt(n, "bad quota %s", n.show())
		}
		if u := rp.peek(); u.kind == tWord && rateUnits[u.text] {
			rp.next()
		}
		if rp.isWord(0, "used") {
			rp.next()
			rp.next()
			if u := rp.peek(); u.kind == tWord && rateUnits[u.text] {
				rp.next()
			}
		}
	}
	if err := rp.allowFork(kw, "quota", "the bytes earlier packets used"); err != nil {
		return nil, err
	}
	txt := rp.textFrom(start)
	o := [2]string{"within " + txt, txt + " used up"}
	switch {
	case named:
		// The object says whether it matches within or over its quota.
		o = [2]string{txt + " matches", txt + " does not match"}
	case over:
		o = [2]string{txt + " exceeded", "not yet " + txt}
	}
	return &forkStmt{txt: txt, outcomes: o}, nil
}

// parseRandom reads a match on meta random. "meta random [& 2^k-1] OP N" holds with
// a known probability (iptables-nft's statistic match) and forks with it; any other
// form is an assumption fork.
func (rp *ruleParser) parseRandom() (stmt, error) {
	start := rp.i
	kw := rp.next()
	rp.next() // random
	bits := 32
	maskOK := true
	if n := rp.peek(); n.kind == tOp && n.text == "&" {
		rp.next()
		mt := rp.next()
		m, err := strconv.ParseUint(mt.text, 0, 32)
		if err != nil || mt.kind != tWord {
			return nil, errAt(mt, "bad meta random mask %s", mt.show())
		}
		bits = 0
		for m&1 == 1 {
			m >>= 1
			bits++
		}
		maskOK = m == 0
	}
	lhsEnd := rp.i
	op := "=="
	if n := rp.peek(); n.kind == tOp {
		op = rp.next().text
	}
	vt := rp.peek()
	v, err := strconv.ParseUint(vt.text, 0, 32)
	if err != nil || vt.kind != tWord || !maskOK {
		if err := rp.allowFork(kw, "this meta random match", "a random number"); err != nil {
			return nil, err
		}
		rp.i = lhsEnd
		return rp.forkMatch(start, kw)
	}
	rp.next()
	size := uint64(1) << bits
	var hits uint64
	switch op {
	case "<":
		hits = min(v, size)
	case "<=":
		hits = min(v+1, size)
	case ">":
		if v+1 < size {
			hits = size - v - 1
		}
	case ">=":
		if v < size {
			hits = size - v
		}
	case "==", "!=":
		if v < size {
			hits = 1
		}
		if op == "!=" {
			hits = size - hits
		}
	default:
		return nil, errAt(vt, "unexpected operator %q", op)
	}
	return &randomStmt{txt: rp.textFrom(start), p: float64(hits) / float64(size)}, nil
}

// pathNeutralTargets are the xt targets known to let every packet go on, with what
// they do instead; the simulator assumes, and says, that they do only that.
var pathNeutralTargets = map[string]string{
	"CHECKSUM": "fills in checksums", "TCPMSS": "clamps the MSS", "LOG": "logs", "NFLOG": "logs",
	"ULOG": "logs", "TRACE": "traces", "AUDIT": "audits", "TTL": "rewrites the TTL",
	"HL": "rewrites the hop limit", "TOS": "rewrites the TOS", "DSCP": "rewrites the DSCP",
	"IDLETIMER": "arms a timer", "LED": "blinks a LED", "TEE": "copies the packet",
	"CLASSIFY": "sets the priority", "CT": "sets conntrack options",
}

// exthdrs are the IPv6 extension headers; the simulator's packets carry none, and
// routeKeys are the rt keys that are not routing header fields.
var (
	exthdrs   = map[string]bool{"rt": true, "frag": true, "hbh": true, "dst": true, "mh": true, "srh": true}
	routeKeys = map[string]bool{"classid": true, "nexthop": true, "mtu": true, "ipsec": true}
)

// absentStmt is a match on a header the packet does not have: loading it fails, and
// the rule does not match whatever the operator.
type absentStmt struct {
	txt  string
	note string
}

func (s *absentStmt) String() string { return s.txt }

func (s *absentStmt) exec(c *evalCtx) (result, *verdict) {
	c.note(s.note)
	return rBreak, nil
}
