package sim

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/nftproxy/nftproxy/nftdata"
	"github.com/nftproxy/nftproxy/packet"
)

// maxJumpDepth is the kernel's jump stack size (NFT_JUMP_STACK_SIZE).
const maxJumpDepth = 16

// maxChoices bounds the numgen decisions on one path.
const maxChoices = 64

// pktState is the packet and everything the kernel attaches to it along its way.
type pktState struct {
	fam      packet.Family
	proto    packet.Protocol
	src, dst netip.AddrPort
	iif, oif string
	mark     uint32
	nftrace  bool
	// local says the node sent the packet (it has a socket); ttl is its IPv4 TTL or
	// IPv6 hop limit, which forwarding decrements.
	local bool
	ttl   uint8
	dscp  uint8
	flags uint8              // tcp flags given with the packet (0: the usual ones)
	icmp  packet.ICMPMessage // icmp message given with the packet

	ctAttached bool
	untracked  bool
	declared   packet.CTState // the state the packet says it is in
	conn       *Conn          // committed entry the packet belongs to
	reply      bool           // the packet travels in the entry's reply direction
	ctStatus   uint32
	ctMark     uint32
	// zone is the conntrack zone (ct zone set before conntrack); zoneDir limits it
	// to one direction (ctDirOriginal or ctDirReply), 0 for both.
	zone    uint16
	zoneDir uint8
	orig    Tuple // tuple when conntrack first saw the packet
	natDone [2]bool
	bound   [2]bool
	binding [2]netip.AddrPort
	masq    bool
	tproxy  string // where tproxy assigned the packet to a socket
	dnatted bool
	snatted bool
}

const (
	manipDst = 0
	manipSrc = 1
)

// ct status bits.
const (
	ctsSeenReply = 2
	ctsAssured   = 4
	ctsConfirmed = 8
	ctsSNAT      = 16
	ctsDNAT      = 32
)

func (st *pktState) ctStateBits() uint32 {
	switch {
	case st.untracked:
		return 64
	case !st.ctAttached:
		return 1 // no conntrack yet: nft reads "invalid"
	case st.conn != nil:
		if st.declared == packet.CTRelated {
			return 4
		}
		return 2
	}
	switch st.declared {
	case packet.CTEstablished:
		return 2
	case packet.CTRelated:
		return 4
	case packet.CTInvalid:
		return 1
	}
	return 8
}

// hasConn reports whether the packet has a conntrack entry (new or committed).
func (st *pktState) hasConn() bool {
	return st.ctAttached && !st.untracked && st.declared != packet.CTInvalid
}

// isNew reports whether this is the first packet of a connection, for which NAT
// chains run.
func (st *pktState) isNew() bool {
	return st.hasConn() && st.conn == nil && st.declared == packet.CTNew
}

func (st *pktState) tuples() (orig, reply Tuple) {
	if st.conn != nil {
		return st.conn.Original, st.conn.Reply
	}
	r := Tuple{Proto: st.proto, Src: st.orig.Dst, Dst: st.orig.Src}
	if st.bound[manipDst] {
		r.Src = st.binding[manipDst]
	}
	if st.bound[manipSrc] {
		r.Dst = st.binding[manipSrc]
	}
	return st.orig, r
}

// packet returns the packet as it is now; CT is its conntrack state (established
// once a committed entry claimed it).
func (st *pktState) packet() packet.Packet {
	ct := st.declared
	if st.conn != nil && ct != packet.CTRelated {
		ct = packet.CTEstablished
	}
	return packet.Packet{Protocol: st.proto, Src: st.src, Dst: st.dst, IIf: st.iif, OIf: st.oif, Mark: st.mark, CT: ct, Flags: st.flags, ICMP: st.icmp}
}

// setEffect is a set or map update made on a branch, committed if the branch is.
type setEffect struct {
	op      string
	set     *setDef
	key     string
	data    string // map data
	expires time.Time
}

// run is one exploration of a trace along a fixed script of numgen choices.
type run struct {
	script  []int
	choices []Choice
	steps   []Step
	setFx   []setEffect
	incs    map[string]uint32
	conn    *Conn
}

// evalCtx is the evaluation state of one run.
type evalCtx struct {
	rt    *Runtime
	st    *pktState
	run   *run
	now   time.Time
	hook  Hook
	depth int
	// current rule, for choices and notes
	tab    *table
	ch     *chain
	ruleIx int
	notes  []string
	// natNote describes the binding a NAT statement set up, for the rule's verdict.
	natNote string
	arena   []byte
	used    int
	err     error
}

// scratch returns an empty buffer for one expression value. Buffers come from a
// per-run arena in 64-byte slots, released when the next statement starts; a value that
// outgrows its slot is reallocated by append, so slots never overlap.
func (c *evalCtx) scratch() []byte {
	if c.used+64 > len(c.arena) {
		return make([]byte, 0, 64)
	}
	b := c.arena[c.used : c.used : c.used+64]
	c.used += 64
	return b
}

func (c *evalCtx) note(s string) { c.notes = append(c.notes, s) }

// noteElem records the element a lookup found: a compiled element of s, or, for an
// element only the packet path added (h.ix == dynElemIx), the key and data.
func (c *evalCtx) noteElem(s *setDef, h hit, key []byte) {
	var txt string
	if h.ix == dynElemIx {
		txt = formatFields(s.key, key)
		if s.isMap {
			txt += " : " + formatFields(s.data, h.data)
		}
	} else {
		txt = s.elemText(h.ix)
	}
	txt = "element " + txt + " in " + s.displayName()
	switch {
	case h.ix == dynElemIx:
		txt += " (added by a packet" + c.expiresText(h.expires) + ")"
	case h.dyn:
		txt += " (refreshed by a packet" + c.expiresText(h.expires) + ")"
	}
	c.notes = append(c.notes, txt)
}

// expiresText is ", expires in D" for an element that times out at exp.
func (c *evalCtx) expiresText(exp time.Time) string {
	if exp.IsZero() {
		return ""
	}
	return ", expires in " + formatDuration(exp.Sub(c.now))
}

func (c *evalCtx) choose(n int, e *numgenExpr) int {
	v := c.decide(Choice{Expr: e.String(), Mod: n, Probability: 1 / float64(n)})
	c.note(fmt.Sprintf("%s = %d (1 of %d)", e, v, n))
	return v
}

// decide takes the next decision of the run's script for ch (Mod values; the first
// run takes 0) and records it.
func (c *evalCtx) decide(ch Choice) int {
	i := len(c.run.choices)
	if i >= maxChoices {
		if c.err == nil {
			c.err = fmt.Errorf("more than %d decisions (numgen, random matches, forks) on one path", maxChoices)
		}
		return 0
	}
	v := 0
	if i < len(c.run.script) {
		v = c.run.script[i]
	}
	ch.Value, ch.Rule = v, c.ruleIx
	if c.tab != nil {
		ch.Table = c.tab.id()
	}
	if c.ch != nil {
		ch.Chain = c.ch.name
	}
	c.run.choices = append(c.run.choices, ch)
	return v
}

// fork follows both outcomes of what the packet cannot decide: it returns 0 on the
// branch that assumes outcomes[0] and 1 on the one that assumes outcomes[1].
func (c *evalCtx) fork(expr string, outcomes [2]string) int {
	v := c.decide(Choice{Expr: expr, Mod: 2, Assumed: true})
	c.run.choices[len(c.run.choices)-1].Outcome = outcomes[v]
	c.note("assuming " + outcomes[v])
	return v
}

// chance follows both outcomes of a random match that holds with probability p: it
// returns 0 on the branch where it holds. A certain outcome does not fork.
func (c *evalCtx) chance(expr string, p float64) int {
	switch {
	case p >= 1:
		return 0
	case p <= 0:
		return 1
	}
	v := c.decide(Choice{Expr: expr, Mod: 2})
	ch := &c.run.choices[len(c.run.choices)-1]
	ch.Probability, ch.Outcome = p, expr+" held"
	if v == 1 {
		ch.Probability, ch.Outcome = 1-p, expr+" did not hold"
	}
	c.note(fmt.Sprintf("%s (probability %s)", ch.Outcome, formatProb(ch.Probability)))
	return v
}

func (c *evalCtx) numgenInc(e *numgenExpr) uint32 {
	if c.run.incs == nil {
		c.run.incs = map[string]uint32{}
	}
	v := c.rt.numgen[e.site] + c.run.incs[e.site]
	c.run.incs[e.site]++
	return v % e.mod
}

// dynElemIx is the index find reports for an element only the packet path added.
const dynElemIx = -2

// hit is what a lookup in a set or map found.
type hit struct {
	// ix is the index of the element in the set's compiled elements, dynElemIx for an
	// element only the packet path added, or -1 when no live element has the key.
	ix int32
	// data is the element's map data (empty for sets and verdict maps).
	data []byte
	// dyn says the packet path added or refreshed the element; expires is then when
	// it times out (zero: never).
	dyn     bool
	expires time.Time
}

// missHit is a lookup that found nothing.
var missHit = hit{ix: -1}

// find looks key up in s: updates made earlier on this run first, then the runtime's
// dynamic elements, then the compiled elements. Expired and deleted elements are
// invisible.
func (c *evalCtx) find(s *setDef, key []byte) hit {
	if s.name != "" {
		for i := len(c.run.setFx) - 1; i >= 0; i-- {
			fx := &c.run.setFx[i]
			if fx.set == s && fx.key == string(key) {
				if fx.op == "delete" || c.expired(fx.expires) {
					return missHit
				}
				return c.dynHit(s, key, fx.data, fx.expires)
			}
		}
		if m := c.rt.dyn[s]; m != nil {
			if d, ok := m[string(key)]; ok {
				if d.deleted || c.expired(d.expires) {
					return missHit
				}
				return c.dynHit(s, key, d.data, d.expires)
			}
		}
	}
	i := s.idx.lookup(key)
	if i < 0 {
		return missHit
	}
	e := &s.elems[i]
	if e.expires > 0 && !c.now.Before(c.rt.start.Add(e.expires)) {
		return missHit
	}
	return hit{ix: i, data: s.dataOf(e)}
}

func (c *evalCtx) expired(exp time.Time) bool {
	return !exp.IsZero() && !c.now.Before(exp)
}

// dynHit reports an element the packet path added or refreshed: as the compiled
// element of the same key (and data) when there is one, else as dynElemIx.
func (c *evalCtx) dynHit(s *setDef, key []byte, data string, exp time.Time) hit {
	h := hit{ix: dynElemIx, data: []byte(data), dyn: true, expires: exp}
	if i := s.idx.lookup(key); i >= 0 && string(s.dataOf(&s.elems[i])) == data {
		h.ix = i
	}
	return h
}

// setUpdate is nft_dynset: add inserts the element unless it is there; update inserts
// it or, when it is there, refreshes its timeout (if it has one) and, like the kernel,
// keeps its data; delete removes it.
func (c *evalCtx) setUpdate(s *setUpdateStmt, key, data []byte) {
	set := s.set
	d := s.timeout
	if d == 0 {
		d = set.timeout
	}
	var exp time.Time
	if d > 0 {
		exp = c.now.Add(d)
	}
	k := formatFields(set.key, key)
	elemText := func(data []byte) string {
		if !set.isMap {
			return k
		}
		return k + " : " + formatFields(set.data, data)
	}
	if s.op == "delete" {
		c.run.setFx = append(c.run.setFx, setEffect{op: "delete", set: set, key: string(key)})
		c.note(fmt.Sprintf("delete %s from @%s", k, set.name))
		return
	}
	h := c.find(set, key)
	if h.ix == -1 {
		c.run.setFx = append(c.run.setFx, setEffect{op: s.op, set: set, key: string(key), data: string(data), expires: exp})
		note := fmt.Sprintf("%s %s in @%s", s.op, elemText(data), set.name)
		if d > 0 {
			note += ", timeout " + formatDuration(d)
		}
		c.note(note)
		return
	}
	if s.op == "add" {
		c.note(fmt.Sprintf("%s already in @%s", elemText(h.data), set.name))
		return
	}
	if h.dyn && h.expires.IsZero() {
		// An element added without a timeout has none to refresh.
		exp = time.Time{}
	}
	c.run.setFx = append(c.run.setFx, setEffect{op: "update", set: set, key: string(key), data: string(h.data), expires: exp})
	note := fmt.Sprintf("update %s in @%s: already there", elemText(h.data), set.name)
	if !exp.IsZero() {
		note += ", timeout refreshed to " + formatDuration(d)
	}
	if set.isMap && string(data) != string(h.data) {
		note += ", data " + formatFields(set.data, data) + " not written (update keeps an element's data)"
	}
	c.note(note)
}

var acceptVerdict = &verdict{kind: vAccept}
var dropVerdict = &verdict{kind: vDrop}

// natSetup records a NAT binding, like nf_nat_setup_info, and accepts.
func (c *evalCtx) natSetup(s *natStmt, addr netip.Addr, port uint16, hasPort bool) (result, *verdict) {
	st := c.st
	if !st.proto.HasPorts() {
		hasPort, port = false, 0
	}
	switch s.kind {
	case natDNAT, natRedirect:
		if s.kind == natRedirect {
			if c.hook == HookOutput {
				addr = netip.MustParseAddr("127.0.0.1")
				if st.fam == packet.IPv6 {
					addr = netip.IPv6Loopback()
				}
			} else {
				addr = c.rt.env.primaryAddr(st.fam == packet.IPv4)
			}
		}
		if !addr.IsValid() {
			addr = st.dst.Addr()
		}
		if !hasPort {
			port = st.dst.Port()
		}
		st.binding[manipDst] = netip.AddrPortFrom(addr, port)
		st.bound[manipDst] = true
		st.ctStatus |= ctsDNAT
		c.natNote = s.kindName() + " to " + formatAddrPort(st.binding[manipDst], st.proto)
	case natSNAT, natMasquerade:
		if s.kind == natMasquerade {
			addr = c.rt.env.masqAddr(st.dst.Addr())
			if !addr.IsValid() {
				c.note("masquerade: no node address of the packet's family; dropped")
				return rVerdict, dropVerdict
			}
			st.masq = true
		}
		if !hasPort {
			port = st.src.Port()
		}
		st.binding[manipSrc] = netip.AddrPortFrom(addr, port)
		st.bound[manipSrc] = true
		st.ctStatus |= ctsSNAT
		c.natNote = s.kindName() + " to " + formatAddrPort(st.binding[manipSrc], st.proto)
	}
	return rVerdict, acceptVerdict
}

func formatAddrPort(ap netip.AddrPort, proto packet.Protocol) string {
	if !proto.HasPorts() {
		return ap.Addr().String()
	}
	return ap.String()
}

func (c *evalCtx) step(s Step) {
	s.Hook = c.hook
	c.run.steps = append(c.run.steps, s)
}

// branchWalk is one walk of a packet through the hooks, along one script of
// numgen choices: the evaluation context, the outcome being filled in, and the
// hooks of the packet's family.
type branchWalk struct {
	c     *evalCtx
	out   *Outcome
	hooks *[numHooks][]hookEntry
}

// runOnce traces p along script and returns the branch.
func (rt *Runtime) runOnce(p packet.Packet, script []int) (*Branch, error) {
	st := &pktState{
		fam: p.Family(), proto: p.Protocol, src: p.Src, dst: p.Dst, iif: p.IIf, oif: p.OIf,
		mark: p.Mark, declared: p.CT, untracked: p.CT == packet.CTUntracked, ttl: 64,
		flags: p.Flags, icmp: p.ICMP,
	}
	r := &run{script: script, steps: make([]Step, 0, 64)}
	c := &evalCtx{rt: rt, st: st, run: r, now: rt.env.now(), ruleIx: -1, arena: make([]byte, 512)}
	fi := 0
	if st.fam == packet.IPv6 {
		fi = 1
	}
	w := &branchWalk{c: c, out: &Outcome{Rule: -1}, hooks: &rt.prog.hooks[fi]}
	out := w.out
	if len(rt.prog.bridged) > 0 {
		c.step(Step{Kind: StepNote, Rule: -1, Detail: "not traced: " + strings.Join(rt.prog.bridged, ", ") +
			" (bridge chains see frames bridged between a bridge's ports and, before prerouting, those reaching the node through one)"})
	}
	switch {
	case p.IIf == "" && rt.local.has(p.Src.Addr()):
		st.local = true
		c.step(Step{Kind: StepNote, Rule: -1, Detail: "locally generated: source " + p.Src.Addr().String() + " is a node address and there is no input interface"})
		c.setOutputOIf()
		if w.pass(HookOutput) {
			break
		}
		// Routing is redone after output, whose DNAT may have changed the destination.
		c.setOutputOIf()
		toLocal := rt.local.has(st.dst.Addr())
		if w.pass(HookPostrouting) {
			break
		}
		if w.passDev(HookEgress) {
			break
		}
		if !toLocal {
			w.route("sent out of the node via " + ifOrUnknown(st.oif))
			out.Delivery = DeliveryOut
			break
		}
		w.route("looped back: " + st.dst.Addr().String() + " is local, the packet re-enters on lo")
		// loopback_xmit orphans the packet: it re-enters without its socket.
		st.iif, st.oif, st.local = "lo", "", false
		if !w.passDev(HookIngress) && !w.pass(HookPrerouting, HookInput) {
			out.Delivery = DeliveryLocal
		}
	default:
		if w.passDev(HookIngress) || w.pass(HookPrerouting) {
			break
		}
		if d := st.dst.Addr(); rt.local.has(d) || pktType(d) != 0 {
			why := " is a local address: input"
			switch {
			case st.tproxy != "":
				why = ": tproxy gave the packet to the socket on " + st.tproxy + ", which policy routing delivers locally: input"
			case !rt.local.has(d):
				// Without multicast routing the kernel delivers multicast and
				// broadcast locally and forwards none.
				why = " is a multicast or broadcast address: input"
			}
			w.route(d.String() + why)
			if !w.pass(HookInput) {
				out.Delivery = DeliveryLocal
			}
			break
		}
		if r, ok := rt.env.route(st.dst.Addr()); ok {
			st.oif = r.Dev
		}
		// ip_forward decrements the TTL before the forward hook.
		st.ttl--
		w.route(st.dst.Addr().String() + " is not a local address: forward via " + ifOrUnknown(st.oif))
		if !w.pass(HookForward, HookPostrouting) && !w.passDev(HookEgress) {
			out.Delivery = DeliveryForward
		}
	}
	return w.finish()
}

// finish returns the branch the walk made, or the error that stopped it.
func (w *branchWalk) finish() (*Branch, error) {
	c, st, out, r := w.c, w.c.st, w.out, w.c.run
	if c.err != nil {
		return nil, c.err
	}
	out.Packet = st.packet()
	out.DNAT = st.dnatted || st.bound[manipDst]
	out.SNAT = st.snatted || st.bound[manipSrc]
	out.Masquerade = st.masq
	switch {
	case st.bound[manipSrc]:
		out.SNATAddr = st.binding[manipSrc].Addr()
	case st.snatted:
		out.SNATAddr = st.src.Addr()
	}
	prob := 1.0
	for _, ch := range r.choices {
		if !ch.Assumed {
			prob *= ch.Probability
		}
	}
	return &Branch{Probability: prob, Choices: r.choices, Steps: r.steps, Outcome: *out, run: r}, nil
}

// stopAt records that the branch ended with a drop or reject, decided at where.
func (w *branchWalk) stopAt(v *verdict, where Step) {
	out := w.out
	if v.kind == vStolen {
		// fwd: the packet leaves by another device, past every later hook.
		out.Verdict, out.Delivery = VerdictAccept, DeliveryForward
		out.Hook, out.Table, out.Chain, out.Rule = where.Hook, where.Table, where.Chain, where.Rule
		w.c.st.oif = v.chainName
		return
	}
	out.Verdict = VerdictDrop
	if v.kind == vReject {
		out.Verdict = VerdictReject
		out.Reject = v.reject
	}
	out.Hook, out.Table, out.Chain, out.Rule = where.Hook, where.Table, where.Chain, where.Rule
	out.Delivery = DeliveryNone
}

// runHook runs what hook h holds, in priority order, and returns the verdict that
// ended the branch there (nil for none) and where it was decided.
func (w *branchWalk) runHook(h Hook) (*verdict, Step) {
	c := w.c
	c.hook = h
	pk := c.st.packet()
	c.step(Step{Kind: StepHook, Depth: 0, Rule: -1, Packet: pk, Detail: "packet " + pk.String()})
	for _, e := range w.hooks[hookIndex[string(h)]] {
		if c.err != nil {
			return nil, Step{}
		}
		switch e.kind {
		case eConntrack:
			c.attach()
		case eConfirm:
			c.confirm()
		case eNAT:
			if v, where := c.runNAT(e); v != nil {
				return v, where
			}
		case eChain:
			if !e.chain.base.hooksDev(c.st, h) {
				continue
			}
			c.noteDevices(e.chain)
			if v, where := c.runBase(e.chain); v != nil {
				return v, where
			}
		}
	}
	return nil, Step{}
}

// pass runs hooks in order; it reports whether one of them ended the branch.
func (w *branchWalk) pass(hs ...Hook) bool {
	for _, h := range hs {
		if v, where := w.runHook(h); v != nil || w.c.err != nil {
			if w.c.err == nil {
				w.stopAt(v, where)
			}
			return true
		}
	}
	return false
}

// route records a routing decision, which belongs to no hook.
func (w *branchWalk) route(detail string) {
	w.c.hook = ""
	w.c.step(Step{Kind: StepRoute, Rule: -1, Detail: detail})
}

func ifOrUnknown(s string) string {
	if s == "" {
		return "(unknown interface)"
	}
	return s
}

// setOutputOIf sets the output interface of a locally generated packet.
func (c *evalCtx) setOutputOIf() {
	st := c.st
	if c.rt.local.has(st.dst.Addr()) {
		st.oif = "lo"
		return
	}
	if r, ok := c.rt.env.route(st.dst.Addr()); ok {
		st.oif = r.Dev
	} else if st.oif == "lo" {
		st.oif = ""
	}
}

// attach is conntrack's lookup at priority -200 of prerouting and output.
func (c *evalCtx) attach() {
	st := c.st
	if st.ctAttached {
		return
	}
	st.ctAttached = true
	st.orig = Tuple{Proto: st.proto, Src: st.src, Dst: st.dst}
	switch {
	case st.untracked:
		c.step(Step{Kind: StepConntrack, Depth: 1, Rule: -1, Detail: "untracked"})
		return
	case st.declared == packet.CTInvalid:
		c.step(Step{Kind: StepConntrack, Depth: 1, Rule: -1, Detail: "invalid (as the packet says)"})
		return
	}
	if conn, reply, ok := c.rt.ct.lookup(st.orig); ok && conn.Zone == st.zone {
		st.conn = conn
		st.reply = reply
		st.ctStatus = ctsConfirmed | ctsSeenReply | ctsAssured
		if conn.DNAT {
			st.ctStatus |= ctsDNAT
		}
		if conn.SNAT {
			st.ctStatus |= ctsSNAT
		}
		st.ctMark = conn.Mark
		st.natDone = [2]bool{true, true}
		st.masq = conn.Masquerade && !reply
		dir := "original"
		if reply {
			dir = "reply"
		}
		c.step(Step{Kind: StepConntrack, Depth: 1, Rule: -1, Detail: "established (" + dir + " direction) of " + conn.String()})
		return
	}
	if st.declared != packet.CTNew {
		c.step(Step{Kind: StepConntrack, Depth: 1, Rule: -1, Detail: st.declared.String() + " (as the packet says; no entry, so no NAT)"})
		return
	}
	c.step(Step{Kind: StepConntrack, Depth: 1, Rule: -1, Detail: "new connection"})
}

// confirm is conntrack's confirmation at the end of postrouting and input: the first
// packet of an accepted connection leaves an entry.
func (c *evalCtx) confirm() {
	st := c.st
	if !st.isNew() || st.ctStatus&ctsConfirmed != 0 {
		return
	}
	st.ctStatus |= ctsConfirmed
	orig, reply := st.tuples()
	conn := &Conn{Original: orig, Reply: reply, DNAT: st.bound[manipDst], SNAT: st.bound[manipSrc],
		Masquerade: st.masq, Mark: st.ctMark, Zone: st.zone}
	c.run.conn = conn
	c.step(Step{Kind: StepConntrack, Depth: 1, Rule: -1, Detail: "confirmed " + conn.String()})
}

// runNAT runs a hook's nat chains for the first packet of a connection and applies the
// connection's translation to every packet, like nf_nat_inet_fn.
func (c *evalCtx) runNAT(e hookEntry) (*verdict, Step) {
	st := c.st
	manip := manipSrc
	if c.hook == HookPrerouting || c.hook == HookOutput {
		manip = manipDst
	}
	if !st.hasConn() {
		if len(e.nat) > 0 {
			c.step(Step{Kind: StepNAT, Depth: 1, Rule: -1, Detail: "nat chains skipped: no conntrack entry (" + strings.TrimSpace(nftdata.CTState.Format(be32(st.ctStateBits()))) + ")"})
		}
		return nil, Step{}
	}
	if !st.natDone[manip] {
		st.natDone[manip] = true
		if st.isNew() {
			for _, ch := range e.nat {
				if v, where := c.runBase(ch); v != nil {
					return v, where
				}
				if st.bound[manip] {
					break
				}
			}
		} else if len(e.nat) > 0 {
			c.step(Step{Kind: StepNAT, Depth: 1, Rule: -1, Detail: "nat chains skipped: not the first packet of a connection"})
		}
	}
	c.applyNAT(manip)
	return nil, Step{}
}

// applyNAT rewrites the packet by the binding of manip (or the committed entry's).
func (c *evalCtx) applyNAT(manip int) {
	st := c.st
	var to netip.AddrPort
	switch {
	case st.conn != nil:
		conn := st.conn
		// Original direction: the packet is translated as the first one was. Reply
		// direction: it is translated back.
		switch {
		case !st.reply && manip == manipDst && conn.DNAT:
			to = conn.Reply.Src
		case !st.reply && manip == manipSrc && conn.SNAT:
			to = conn.Reply.Dst
		case st.reply && manip == manipDst && conn.SNAT:
			to = conn.Original.Src
		case st.reply && manip == manipSrc && conn.DNAT:
			to = conn.Original.Dst
		default:
			return
		}
	case st.bound[manip]:
		to = st.binding[manip]
	default:
		return
	}
	if manip == manipDst {
		if st.dst == to {
			return
		}
		c.step(Step{Kind: StepNAT, Depth: 1, Rule: -1, Detail: "destination " + formatAddrPort(st.dst, st.proto) + " translated to " + formatAddrPort(to, st.proto)})
		st.dst = to
		st.dnatted = true
		return
	}
	if st.src == to {
		return
	}
	c.step(Step{Kind: StepNAT, Depth: 1, Rule: -1, Detail: "source " + formatAddrPort(st.src, st.proto) + " translated to " + formatAddrPort(to, st.proto)})
	st.src = to
	st.snatted = true
}

type frame struct {
	ch   *chain
	next int
}

// runBase runs a base chain; it returns a non-nil verdict for drop or reject, with the
// step that decided it.
func (c *evalCtx) runBase(bc *chain) (*verdict, Step) {
	stack := []frame{{ch: bc}}
	tab := bc.table.id()
	c.tab = bc.table
	c.step(Step{Kind: StepChain, Depth: 1, Table: tab, Chain: bc.name, Rule: -1,
		Detail: fmt.Sprintf("type %s hook %s priority %s", bc.base.typ, bc.base.hook, bc.base.prioText)})
	policy := func() (*verdict, Step) {
		s := Step{Kind: StepPolicy, Depth: 1, Hook: c.hook, Table: tab, Chain: bc.name, Rule: -1}
		if bc.base.policy == vDrop {
			s.Verdict = "drop"
			c.step(s)
			return dropVerdict, s
		}
		s.Verdict = "accept"
		c.step(s)
		return nil, Step{}
	}
	for {
		if c.err != nil {
			return nil, Step{}
		}
		top := &stack[len(stack)-1]
		if top.next >= len(top.ch.rules) {
			if len(stack) == 1 {
				return policy()
			}
			c.step(Step{Kind: StepReturn, Depth: len(stack), Table: tab, Chain: top.ch.name, Rule: -1, Detail: "end of chain"})
			stack = stack[:len(stack)-1]
			continue
		}
		ix := top.next
		rl := top.ch.rules[ix]
		top.next++
		c.ch, c.ruleIx = top.ch, ix
		c.notes = c.notes[:0]
		c.natNote = ""
		var v *verdict
		matched := true
		var decided stmt
		for _, s := range rl.stmts {
			c.used = 0
			res, sv := s.exec(c)
			if res == rBreak {
				matched = false
				decided = s
				break
			}
			if res == rVerdict {
				v = sv
				decided = s
				break
			}
		}
		rs := Step{Kind: StepRule, Depth: len(stack) + 1, Hook: c.hook, Table: tab, Chain: top.ch.name, Rule: ix, RuleText: rl.text, Matched: matched}
		if decided != nil {
			rs.Expr = decided.String()
		}
		if v != nil {
			rs.Verdict = v.String()
			if _, ok := decided.(*natStmt); ok && c.natNote != "" {
				rs.Verdict = c.natNote
			}
		}
		rs.Detail = strings.Join(c.notes, "; ")
		c.step(rs)
		if c.err != nil {
			return nil, Step{}
		}
		if v == nil {
			continue
		}
		switch v.kind {
		case vAccept:
			return nil, Step{}
		case vDrop, vReject, vStolen:
			return v, rs
		case vContinue:
		case vReturn:
			if len(stack) == 1 {
				return policy()
			}
			c.step(Step{Kind: StepReturn, Depth: len(stack), Table: tab, Chain: top.ch.name, Rule: -1, Detail: "return"})
			stack = stack[:len(stack)-1]
		case vJump:
			if len(stack) >= maxJumpDepth {
				c.err = fmt.Errorf("table %s chain %s: jump stack deeper than %d", tab, top.ch.name, maxJumpDepth)
				return nil, Step{}
			}
			stack = append(stack, frame{ch: v.chain})
			c.step(Step{Kind: StepChain, Depth: len(stack), Table: tab, Chain: v.chain.name, Rule: -1, Detail: "jump"})
		case vGoto:
			stack[len(stack)-1] = frame{ch: v.chain}
			c.step(Step{Kind: StepChain, Depth: len(stack), Table: tab, Chain: v.chain.name, Rule: -1, Detail: "goto"})
		}
	}
}
