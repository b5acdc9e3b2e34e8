package proxy_test

import (
	"bufio"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/nftproxy/nftproxy/e2e/lab"
	"github.com/nftproxy/nftproxy/packet"
	"github.com/nftproxy/nftproxy/sim"
)

// This file compares the path a packet takes through the proxier's ruleset on the kernel,
// as `nft monitor trace` reports it, with the path the simulator predicts for the same
// packet through the same ruleset.
//
// A path is the sequence of what the kernel reports and the simulator models alike:
//   - entering a netfilter hook, with the packet as it enters (protocol, addresses, ports,
//     input and output interface): the kernel prints it with the first event of each base
//     chain, the simulator with each hook;
//   - entering a base chain of the proxier's tables;
//   - every rule whose matches all held, by chain and index in the chain, with its verdict
//     (continue, jump, goto, return, accept, drop);
//   - a base chain's policy, when the packet fell off its end.
//
// Rules that did not match, and regular chains that were left by falling off their end,
// are not part of it: the kernel does not report them. The tracing table itself is left
// out. Verdicts are compared as the kernel reports them: a NAT statement accepts, and a
// reject drops (the kernel sends the rejection itself); whether a packet was rejected or
// dropped, and where it went, is compared separately with what the client observed.

// traceTable is the table that marks the test packets for tracing. It is not the
// proxier's and not of the proxier's families, and it runs before everything else.
const traceTable = "nftproxy-trace"

// Test packets of the path suite use source ports from traceFirstPort on; only their
// first packet (a TCP SYN, or the UDP datagram) is traced.
const traceFirstPort = 41000

var traceTableScript = fmt.Sprintf(`table inet %[1]s {
	chain pre {
		type filter hook prerouting priority -400; policy accept;
		meta l4proto tcp tcp sport %[2]d-%[3]d tcp flags & (syn | ack) == syn meta nftrace set 1
		meta l4proto udp udp sport %[2]d-%[3]d meta nftrace set 1
	}
	chain out {
		type filter hook output priority -400; policy accept;
		meta l4proto tcp tcp sport %[2]d-%[3]d tcp flags & (syn | ack) == syn meta nftrace set 1
		meta l4proto udp udp sport %[2]d-%[3]d meta nftrace set 1
	}
}
`, traceTable, traceFirstPort, traceFirstPort+999)

// hopKind says what a hop of a path records.
type hopKind int

const (
	hopHook hopKind = iota
	hopChain
	hopRule
	hopPolicy
)

// hop is one element of a path.
type hop struct {
	kind hopKind
	// hook and pkt are set for hopHook.
	hook string
	pkt  string
	// family ("ip", "ip6") and chain are set for the other kinds.
	family, chain string
	// rule is the rule's index in its chain (-1 when the kernel's rule text was not
	// found in the chain); text is the rule as printed, for display only.
	rule    int
	text    string
	verdict string
}

// key is what paths are compared on.
func (h hop) key() string {
	switch h.kind {
	case hopHook:
		return "hook " + h.hook + ": " + h.pkt
	case hopChain:
		return "  " + h.family + " " + h.chain
	case hopRule:
		return fmt.Sprintf("    %s[%d] -> %s", h.chain, h.rule, h.verdict)
	}
	return "    " + h.chain + " policy " + h.verdict
}

// String is the hop for display: its key and, for a rule, the rule text.
func (h hop) String() string {
	if h.kind == hopRule {
		return h.key() + "   # " + h.text
	}
	return h.key()
}

// pathsEqual reports whether two paths have the same keys.
func pathsEqual(a, b []hop) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].key() != b[i].key() {
			return false
		}
	}
	return true
}

// sideBySide renders two paths in two columns, marking the rows that differ with "!" and
// spelling out the rules of those rows below the columns.
func sideBySide(leftTitle string, left []hop, rightTitle string, right []hop) string {
	width := len(leftTitle)
	for _, h := range left {
		width = max(width, len(h.key()))
	}
	var b, rules strings.Builder
	fmt.Fprintf(&b, "  %-*s | %s\n", width, leftTitle, rightTitle)
	for i := range max(len(left), len(right)) {
		var l, r hop
		if i < len(left) {
			l = left[i]
		}
		if i < len(right) {
			r = right[i]
		}
		mark := " "
		if i >= len(left) || i >= len(right) || l.key() != r.key() {
			mark = "!"
			for _, side := range []struct {
				title string
				h     hop
			}{{leftTitle, l}, {rightTitle, r}} {
				if side.h.kind == hopRule {
					fmt.Fprintf(&rules, "  row %d, %s: %s[%d] is: %s\n", i+1, side.title, side.h.chain, side.h.rule, side.h.text)
				}
			}
		}
		var lk, rk string
		if i < len(left) {
			lk = l.key()
		}
		if i < len(right) {
			rk = r.key()
		}
		fmt.Fprintf(&b, "%s %-*s | %s\n", mark, width, lk, rk)
	}
	return b.String() + rules.String()
}

func formatPath(p []hop) string {
	var b strings.Builder
	for _, h := range p {
		b.WriteString(h.String())
		b.WriteByte('\n')
	}
	return b.String()
}

// pktString renders the fields of a packet that paths compare.
func pktString(proto string, src, dst netip.AddrPort, iif, oif string) string {
	s := fmt.Sprintf("%s %s -> %s", proto, src, dst)
	if iif != "" {
		s += " iif " + iif
	}
	if oif != "" {
		s += " oif " + oif
	}
	return s
}

// listing is what `nft -a list table` says about the chains of a table.
type listing struct {
	// rules holds each chain's rules in order, as nft prints them.
	rules map[string][]string
	// hooks holds the hook of each base chain.
	hooks map[string]string
}

var (
	handleRE = regexp.MustCompile(`^(.*) # handle \d+$`)
	chainRE  = regexp.MustCompile(`^chain (\S+) \{`)
	hookRE   = regexp.MustCompile(`^type \S+ hook (\S+) `)
)

// parseListing reads `nft -a list table` output.
func parseListing(text string) listing {
	ls := listing{rules: map[string][]string{}, hooks: map[string]string{}}
	chain := ""
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case chain == "":
			if m := chainRE.FindStringSubmatch(line); m != nil {
				chain = m[1]
				ls.rules[chain] = nil
			}
		case line == "}":
			chain = ""
		case hookRE.MatchString(line):
			ls.hooks[chain] = hookRE.FindStringSubmatch(line)[1]
		default:
			if m := handleRE.FindStringSubmatch(line); m != nil {
				ls.rules[chain] = append(ls.rules[chain], m[1])
			}
		}
	}
	return ls
}

// kernelEvent is one line of `nft monitor trace`.
type kernelEvent struct {
	id, family, table, chain string
	// kind is "packet", "rule", "policy" or "verdict".
	kind    string
	rule    string
	verdict string
	pkt     string
	sport   uint16
}

var (
	traceLineRE = regexp.MustCompile(`^trace id (\S+) (\S+) (\S+) (\S+) (packet|rule|policy|verdict):? (.*)$`)
	iifRE       = regexp.MustCompile(`\biif "([^"]+)"`)
	oifRE       = regexp.MustCompile(`\boif "([^"]+)"`)
	saddrRE     = regexp.MustCompile(`\bip6? saddr (\S+)`)
	daddrRE     = regexp.MustCompile(`\bip6? daddr (\S+)`)
	l4RE        = regexp.MustCompile(`\b(tcp|udp|sctp) sport (\d+) (?:tcp|udp|sctp) dport (\d+)`)
)

// parseTraceLine parses a trace line; ok is false for lines of another shape.
func parseTraceLine(line string) (ev kernelEvent, ok bool) {
	m := traceLineRE.FindStringSubmatch(strings.TrimSpace(line))
	if m == nil {
		return ev, false
	}
	ev = kernelEvent{id: m[1], family: m[2], table: m[3], chain: m[4], kind: m[5]}
	rest := m[6]
	switch ev.kind {
	case "packet":
		field := func(re *regexp.Regexp) string {
			if f := re.FindStringSubmatch(rest); f != nil {
				return f[1]
			}
			return ""
		}
		l4 := l4RE.FindStringSubmatch(rest)
		src, err1 := netip.ParseAddr(field(saddrRE))
		dst, err2 := netip.ParseAddr(field(daddrRE))
		if l4 == nil || err1 != nil || err2 != nil {
			ev.pkt = "unparsed: " + rest
			break
		}
		sport, _ := strconv.Atoi(l4[2])
		dport, _ := strconv.Atoi(l4[3])
		ev.sport = uint16(sport)
		ev.pkt = pktString(l4[1], netip.AddrPortFrom(src, uint16(sport)), netip.AddrPortFrom(dst, uint16(dport)), field(iifRE), field(oifRE))
	case "rule":
		i := strings.LastIndex(rest, " (verdict ")
		if i < 0 {
			return ev, false
		}
		ev.rule = rest[:i]
		ev.verdict = strings.TrimSuffix(rest[i+len(" (verdict "):], ")")
	case "policy", "verdict":
		ev.verdict = strings.Fields(rest + " ?")[0]
	}
	return ev, true
}

// kernelPackets groups trace lines by traced packet: a packet starts with its packet
// line in the tracing table (every traced packet passes it first), and its later events
// carry the same trace id. It returns the events of the first packet of each source port.
func kernelPackets(lines []string) map[uint16][]kernelEvent {
	var packets [][]kernelEvent
	current := map[string]int{} // trace id -> index in packets
	for _, line := range lines {
		ev, ok := parseTraceLine(line)
		if !ok {
			continue
		}
		if ev.table == traceTable && ev.kind == "packet" {
			current[ev.id] = len(packets)
			packets = append(packets, []kernelEvent{ev})
			continue
		}
		if i, ok := current[ev.id]; ok {
			packets[i] = append(packets[i], ev)
		}
	}
	bySport := map[uint16][]kernelEvent{}
	for _, evs := range packets {
		if _, dup := bySport[evs[0].sport]; !dup {
			bySport[evs[0].sport] = evs
		}
	}
	return bySport
}

// kernelPath turns a packet's trace events into a path, with rule indexes looked up in
// the tables' listings (by family).
func kernelPath(evs []kernelEvent, listings map[string]listing) []hop {
	var path []hop
	hook := ""
	for _, ev := range evs {
		if ev.table == traceTable {
			continue
		}
		ls := listings[ev.family]
		switch ev.kind {
		case "packet":
			if h := ls.hooks[ev.chain]; h != hook {
				hook = h
				path = append(path, hop{kind: hopHook, hook: h, pkt: ev.pkt})
			}
			path = append(path, hop{kind: hopChain, family: ev.family, chain: ev.chain})
		case "rule":
			idx := -1
			for i, r := range ls.rules[ev.chain] {
				if r == ev.rule {
					idx = i
					break
				}
			}
			path = append(path, hop{kind: hopRule, family: ev.family, chain: ev.chain, rule: idx, text: ev.rule, verdict: ev.verdict})
		case "policy":
			path = append(path, hop{kind: hopPolicy, family: ev.family, chain: ev.chain, verdict: ev.verdict})
		}
	}
	return path
}

// simVerdict spells a simulator rule verdict as the kernel's trace does.
func simVerdict(v string) string {
	switch {
	case v == "":
		return "continue"
	case strings.HasPrefix(v, "reject"):
		return "drop"
	case strings.HasPrefix(v, "dnat"), strings.HasPrefix(v, "snat"),
		strings.HasPrefix(v, "masquerade"), strings.HasPrefix(v, "redirect"):
		return "accept"
	}
	return v
}

// simPath turns a simulator branch into a path.
func simPath(br *sim.Branch) []hop {
	var path []hop
	var hook sim.Hook
	var pkt packet.Packet
	emitted := false
	for _, st := range br.Steps {
		family, _, _ := strings.Cut(st.Table, " ")
		switch st.Kind {
		case sim.StepHook:
			hook, pkt, emitted = st.Hook, st.Packet, false
		case sim.StepChain:
			if st.Depth != 1 {
				continue
			}
			if !emitted {
				path = append(path, hop{kind: hopHook, hook: string(hook),
					pkt: pktString(pkt.Protocol.String(), pkt.Src, pkt.Dst, pkt.IIf, pkt.OIf)})
				emitted = true
			}
			path = append(path, hop{kind: hopChain, family: family, chain: st.Chain})
		case sim.StepRule:
			if st.Matched {
				path = append(path, hop{kind: hopRule, family: family, chain: st.Chain, rule: st.Rule, text: st.RuleText, verdict: simVerdict(st.Verdict)})
			}
		case sim.StepPolicy:
			path = append(path, hop{kind: hopPolicy, family: family, chain: st.Chain, verdict: st.Verdict})
		}
	}
	return path
}

// simEnv describes the lab's node to the simulator: its addresses, and routes as the
// node has them (with the address masquerade picks towards each).
func simEnv(l *lab.Lab) sim.Env {
	env := sim.Env{
		LocalAddrs: []netip.Addr{nodeV4.Addr(), link1V4.Addr(), nodeV6.Addr(), link1V6.Addr()},
		Seed:       1,
	}
	for _, p := range l.Pods() {
		if p.Remote {
			continue
		}
		for _, a := range p.Addrs {
			env.Routes = append(env.Routes, sim.Route{Prefix: netip.PrefixFrom(a, a.BitLen()), Dev: p.HostVeth})
		}
	}
	for _, c := range remotePodCIDRs {
		env.Routes = append(env.Routes, sim.Route{Prefix: c, Dev: "eth1", Src: masqAddr(podR, c.Addr().Is6())})
	}
	for _, c := range []netip.Prefix{nodeV4, nodeV6} {
		env.Routes = append(env.Routes, sim.Route{Prefix: c.Masked(), Dev: "eth0"})
	}
	for _, c := range []netip.Prefix{link1V4, link1V6} {
		env.Routes = append(env.Routes, sim.Route{Prefix: c.Masked(), Dev: "eth1", Src: c.Addr()})
	}
	env.Routes = append(env.Routes,
		sim.Route{Prefix: netip.MustParsePrefix("0.0.0.0/0"), Dev: "void0"},
		sim.Route{Prefix: netip.MustParsePrefix("::/0"), Dev: "void0"})
	return env
}

// pathCase is a test packet of the path suite: the first packet of an echo exchange.
type pathCase struct {
	name string
	// from is "client", "node", or a pod's name.
	from  string
	proto lab.Proto
	src   netip.Addr
	dst   netip.AddrPort
	want  lab.Outcome
}

// sender returns the namespace a case sends from and the interface its packets arrive on
// at the node ("" when the node sends them).
func (c pathCase) sender(l *lab.Lab) (*lab.NS, string) {
	switch c.from {
	case "client":
		return l.Client, "eth0"
	case "node":
		return l.Node, ""
	}
	p := l.Pod(c.from)
	if p.Remote {
		return p.NS, "eth1"
	}
	return p.NS, p.HostVeth
}

// pathCases are the packets compared: every kind of frontend and outcome.
func pathCases(l *lab.Lab) []pathCase {
	c4, c6 := clientV4.Addr(), clientV6.Addr()
	podC4, podC6 := podAddr(l, podC, false), podAddr(l, podC, true)
	return []pathCase{
		{"pod -> ClusterIP", podC, lab.TCP, podC4, cipWeb, lab.Answered},
		{"pod -> ClusterIP, IPv6", podC, lab.TCP, podC6, cipWeb6, lab.Answered},
		{"pod -> ClusterIP, UDP", podC, lab.UDP, podC4, cipWeb, lab.Answered},
		{"pod -> itself through a ClusterIP (hairpin when chosen)", podA, lab.TCP, podAddr(l, podA, false), cipWeb, lab.Answered},
		{"remote pod -> ClusterIP", podR, lab.TCP, podAddr(l, podR, false), cipWeb, lab.Answered},
		{"node -> ClusterIP", "node", lab.TCP, nodeV4.Addr(), cipWeb, lab.Answered},
		{"external -> NodePort", "client", lab.TCP, c4, nodePortOf(false, nodePortWeb), lab.Answered},
		{"external -> NodePort, IPv6", "client", lab.TCP, c6, nodePortOf(true, nodePortWeb), lab.Answered},
		{"external -> LoadBalancer IP", "client", lab.TCP, c4, lbWeb, lab.Answered},
		{"external -> ExternalIP", "client", lab.TCP, c4, externalWeb, lab.Answered},
		{"pod -> sessionAffinity ClusterIP", podC, lab.TCP, podC4, cipSticky, lab.Answered},
		{"pod -> Service without endpoints: reject", podC, lab.TCP, podC4, cipEmpty, lab.Refused},
		{"pod -> Service without endpoints, UDP: reject", podC, lab.UDP, podC4, cipEmpty, lab.Refused},
		{"pod -> ClusterIP on a port it lacks: reject", podC, lab.TCP, podC4, netip.AddrPortFrom(cipWeb.Addr(), 81), lab.Refused},
		{"external -> NodePort without endpoints: reject", "client", lab.TCP, c4, nodePortOf(false, nodePortEmpty), lab.Refused},
		{"pod -> unallocated service address: drop", podC, lab.TCP, podC4, unallocated, lab.TimedOut},
		{"external -> ETP Local LoadBalancer IP", "client", lab.TCP, c4, lbLocal, lab.Answered},
		{"external -> ETP Local NodePort", "client", lab.TCP, c4, nodePortOf(false, nodePortLocal), lab.Answered},
		{"node -> ETP Local LoadBalancer IP", "node", lab.TCP, nodeV4.Addr(), lbLocal, lab.Answered},
		{"external -> ETP Local without local endpoint: drop", "client", lab.TCP, c4, lbRemoteOnly, lab.TimedOut},
		{"external -> ETP Local NodePort without local endpoint: drop", "client", lab.TCP, c4, nodePortOf(false, nodePortRemote), lab.TimedOut},
		{"pod -> ETP Local without local endpoint", podC, lab.TCP, podC4, lbRemoteOnly, lab.Answered},
		{"allowed source -> LoadBalancer IP with source ranges", "client", lab.TCP, c4, lbRanged, lab.Answered},
		{"other source -> LoadBalancer IP with source ranges: drop", "client", lab.TCP, client2V4.Addr(), lbRanged, lab.TimedOut},
	}
}

// compareCase compares the kernel's path and outcome of a case with the simulator's trace
// of the same packet through prog, and returns what disagrees (nothing when they agree).
func compareCase(c pathCase, pkt packet.Packet, kpath []hop, outcome lab.Outcome, reply lab.Reply,
	l *lab.Lab, prog *sim.Program, source string) []string {
	tr, err := prog.Trace(pkt, simEnv(l))
	if err != nil {
		return []string{fmt.Sprintf("simulator (%s) cannot trace %s: %v", source, pkt, err)}
	}
	var problems []string
	br := tr.Branches[0]
	if outcome == lab.Answered {
		want := netip.AddrPortFrom(podAddr(l, reply.Pod, c.dst.Addr().Is6()), echoPort)
		br = nil
		for _, b := range tr.Branches {
			if b.Outcome.Verdict == sim.VerdictAccept && b.Outcome.Packet.Dst == want {
				br = b
				break
			}
		}
		if br == nil {
			return []string{fmt.Sprintf("the kernel connected %s to %s (%s); the simulator (%s) has no branch to it:\n%s",
				pkt, want, reply.Pod, source, tr)}
		}
		if got := br.Outcome.Packet.Src.Addr(); got != reply.Source.Addr() {
			problems = append(problems, fmt.Sprintf("%s saw source %s on the kernel; the simulator (%s) says %s",
				reply.Pod, reply.Source.Addr(), source, got))
		}
	} else {
		// Without DNAT there is nothing to choose: prefer a branch with the kernel's path.
		for _, b := range tr.Branches {
			if pathsEqual(simPath(b), kpath) {
				br = b
				break
			}
		}
	}
	wantVerdict := map[lab.Outcome]sim.Verdict{lab.Answered: sim.VerdictAccept, lab.Refused: sim.VerdictReject, lab.TimedOut: sim.VerdictDrop}[outcome]
	if br.Outcome.Verdict != wantVerdict {
		problems = append(problems, fmt.Sprintf("the client saw %s on the kernel; the simulator (%s) says %s", outcome, source, br.Outcome.Verdict))
	}
	if spath := simPath(br); !pathsEqual(kpath, spath) {
		problems = append(problems, fmt.Sprintf("paths differ (simulator compiled from %s):\n%s", source,
			sideBySide("kernel (nft monitor trace)", kpath, "simulator", spath)))
	}
	return problems
}

// sentSource names the ruleset the mirror Proxier wrote into its Fakes, nft transactions
// and netlink batches decoded back, in the path suite's messages.
const sentSource = "what the Proxier sent"

var _ = Describe("Path agreement between the kernel and the simulator", Label("kernel"), func() {
	It("takes the same path through the proxier's ruleset on both, packet by packet", func(ctx SpecContext) {
		l := newLab(topology())
		p := startProxy(ctx, l)
		// The kernel's view of the tables before the traffic (which adds affinity set
		// elements): rule order for the paths, and the listing the simulator compiles,
		// next to what the Proxier sent (its mirror's Fakes).
		listings := map[string]listing{}
		var listed strings.Builder
		for _, fam := range []string{"ip", "ip6"} {
			out, err := l.Node.Exec(ctx, "", "nft", "-a", "list", "table", fam, p.cfg.Table)
			Expect(err).NotTo(HaveOccurred())
			listings[fam] = parseListing(out)
			out, err = l.Node.Exec(ctx, "", "nft", "list", "table", fam, p.cfg.Table)
			Expect(err).NotTo(HaveOccurred())
			listed.WriteString(out)
		}
		programs := map[string]*sim.Program{}
		for source, text := range map[string]string{"nft list table": listed.String(), sentSource: p.FakeDump()} {
			prog, err := sim.CompileText(text)
			Expect(err).NotTo(HaveOccurred(), "compiling %s", source)
			programs[source] = prog
		}

		Expect(l.Node.NFTApply(ctx, traceTableScript)).To(Succeed())
		trace, err := l.Node.StartTrace()
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _, _ = trace.Stop() })

		cases := pathCases(l)
		outcomes := make([]lab.Outcome, len(cases))
		replies := make([]lab.Reply, len(cases))
		for i, c := range cases {
			ns, _ := c.sender(l)
			req := lab.Request{Proto: c.proto, Dst: c.dst, Src: netip.AddrPortFrom(c.src, uint16(traceFirstPort+i))}
			if c.want == lab.TimedOut {
				req.Timeout = dropTimeout
			}
			r, err := ns.Echo(req)
			outcomes[i], replies[i] = lab.Classify(err), r
			Expect(outcomes[i]).To(Equal(c.want), "%s: %v", c.name, err)
		}
		countConnections(len(cases))
		// Every traced packet went through the node before its exchange ended (with an
		// answer, a refusal or a timeout); give the monitor the time to print it all.
		Eventually(func() int { return len(kernelPackets(trace.Lines())) }).Should(Equal(len(cases)))
		time.Sleep(100 * time.Millisecond)
		lines, err := trace.Stop()
		Expect(err).NotTo(HaveOccurred())
		byPort := kernelPackets(lines)

		var mismatches []string
		hops := 0
		for i, c := range cases {
			_, iif := c.sender(l)
			evs, ok := byPort[uint16(traceFirstPort+i)]
			if !ok {
				mismatches = append(mismatches, fmt.Sprintf("%s: the kernel traced nothing", c.name))
				continue
			}
			kpath := kernelPath(evs, listings)
			hops += len(kpath)
			pkt := packet.Packet{Protocol: map[lab.Proto]packet.Protocol{lab.TCP: packet.TCP, lab.UDP: packet.UDP}[c.proto],
				Src: netip.AddrPortFrom(c.src, uint16(traceFirstPort+i)), Dst: c.dst, IIf: iif}
			for _, source := range []string{"nft list table", sentSource} {
				for _, problem := range compareCase(c, pkt, kpath, outcomes[i], replies[i], l, programs[source], source) {
					mismatches = append(mismatches, fmt.Sprintf("%s (%s, %s):\n%s", c.name, pkt, outcomes[i], problem))
				}
			}
			GinkgoWriter.Printf("%s (%s, %s):\n%s\n", c.name, pkt, outcomes[i], formatPath(kpath))
		}
		report("path agreement: %d packets, %d hops each compared with the simulator compiled from `nft list table` and from what the Proxier sent; %d mismatches",
			len(cases), hops, len(mismatches))
		if len(mismatches) > 0 {
			Fail(fmt.Sprintf("%d disagreements between the kernel and the simulator:\n\n%s", len(mismatches), strings.Join(mismatches, "\n\n")))
		}
	})
})
