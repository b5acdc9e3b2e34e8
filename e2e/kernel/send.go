package kernel

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/e2e/lab"
	"github.com/nftproxy/nftproxy/features"
	"github.com/nftproxy/nftproxy/packet"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
)

// Sampling: a packet expected to reach one of several endpoints is sent as several new
// connections, until every expected endpoint answered (at least minSamples, at most
// samplesPerEndpoint per expected endpoint), so that the Observation's endpoints are the
// set that answered; an endpoint used beyond the expected ones, one of three, escapes
// minSamples connections with probability (2/3)^16 < 0.2%. A sticky expectation sends
// stickySamples connections, which must all reach the same endpoint. Other expectations
// send one.
const (
	minSamples         = 16
	samplesPerEndpoint = 20
	stickySamples      = 3
	maxTraceLines      = 150
)

// nodePortBase is the first source port of the node's own connections; they use
// nodePortBase+i for their i-th sample (at most nodePorts of them). Masquerading maps a
// source port of 512-1023 into 600-1023 (the kernel's convention for ports below 1024), so
// a masqueraded connection from 512-599 always shows the endpoint a new port, even when
// the node's own address stays. From a port in the ephemeral range it keeps its port with
// probability 1/64512 and would look unmasqueraded; a run of the suite saw that happen.
const (
	nodePortBase = 512
	nodePorts    = 88
)

// ipv6TCPTimeout is the least time a TCP connection over IPv6 is given. In the lab the
// node's ICMPv6 port-unreachable for a rejected SYN reaches the client while its
// connect() still holds the socket (veths deliver within the sending call): TCP counts it
// in TcpExtLockDroppedIcmps, keeps it as a soft error, and fails the connection only when
// the SYN it retransmits after one second is rejected again. With the default timeout
// every IPv6 reject looked like a drop. IPv4 rejects fail the connection at once in the
// same lab (e2e/lab tests that).
const ipv6TCPTimeout = 1500 * time.Millisecond

// sample is one connection a Send made.
type sample struct {
	src     netip.AddrPort // the source asked for (port 0: any)
	outcome lab.Outcome
	err     error
	reply   lab.Reply
	// endpoint is where the node's conntrack sent the connection: the source of its
	// reply direction; valid when found.
	endpoint netip.AddrPort
	// void counts the connection's packets that the node sent on into void0, the lab's
	// route to nowhere, when it got no answer: accepted, but nobody has the destination.
	void voidCounts
	note string
}

func (s sample) dnat(dst netip.AddrPort) bool { return s.endpoint.IsValid() && s.endpoint != dst }

func (s sample) local() bool { return s.outcome == lab.Answered && s.reply.Pod == responderName }

// voided reports whether the node accepted the connection and sent it on into void0.
func (s sample) voided() bool { return s.outcome == lab.TimedOut && s.void.all > 0 }

func (s sample) masquerade() bool {
	if s.voided() {
		return s.void.snat > 0
	}
	return s.reply.Source != s.reply.Local
}

// verdict is the sample's outcome in the Observation's words.
func (s sample) verdict() string {
	switch {
	case s.outcome == lab.Answered || s.voided():
		return "accept"
	case s.outcome == lab.Refused:
		return "reject"
	}
	return "drop"
}

// Send implements features.Backend. It opens real connections from the namespace that
// owns p's source to p.Dst, as many as exp calls for (see minSamples), after flushing the
// node's conntrack so that no earlier connection shadows them. The first is bound to
// p.Src, further ones to p.Src's address and a fresh port; the node's own connections
// use ports from nodePortBase. It reports:
//   - answered by a pod: accept, DNAT to the endpoint the node's conntrack shows, with
//     the source the pod saw, masqueraded when that is not the client socket's own
//     address and port;
//   - answered by the node itself: accept, delivered locally;
//   - refused: reject;
//   - no answer, with the node having sent the packets on into void0 (the lab's route
//     to nowhere): accept, not DNATed and not masqueraded unless the node's conntrack
//     says so — the packet passed untouched;
//   - no answer otherwise: drop.
//
// Packets the lab cannot send as stated return an error wrapping
// features.ErrUnsupported, which says why.
func (b *Backend) Send(p packet.Packet, from features.Origin, exp *features.Expect) (*features.Observation, error) {
	if b.lab == nil {
		return nil, errors.New("kernel backend: Send before Start")
	}
	pl, err := b.topo.Locate(p, from, exp)
	if err != nil {
		return nil, err
	}
	proto, _ := labProto(p.Protocol)
	if proto == lab.SCTP && !lab.SCTPSupported() {
		return nil, fmt.Errorf("kernel backend: packet %s: this kernel cannot open SCTP sockets (no sctp module): %w", p, features.ErrUnsupported)
	}
	if b.behind > 0 {
		if names := affinityServices(b.st, b.sc.Node.Addresses, p); len(names) > 0 {
			return nil, fmt.Errorf("kernel backend: packet %s: the scenario's clock is %v ahead of the kernel's after skipped advances, "+
				"and the session affinity of %s expires on the kernel's clock: %w", p, b.behind, strings.Join(names, ", "), features.ErrUnsupported)
		}
	}
	ns := b.namespace(pl)
	if err := b.lab.Node.FlushConntrack(); err != nil {
		return nil, err
	}
	mark := 0
	if b.trace != nil {
		mark = len(b.trace.Lines())
	}
	samples, err := b.sample(ns, proto, p, exp)
	if err != nil {
		return nil, fmt.Errorf("kernel backend: packet %s from %s: %w", p, pl, err)
	}
	obs := observe(p, exp, samples)
	// The suite prints the trace of a failed step only; only then is it worth waiting
	// for the last trace events and listing the ruleset.
	failed := features.Check(exp, obs, netip.AddrPort{}) != nil
	obs.Trace = b.account(p, ns, samples, mark, failed)
	if failed {
		// With handles: the monitor, started before the tables, names rules by handle.
		if rs, err := b.lab.Node.Exec(context.Background(), "", "nft", "-a", "list", "ruleset"); err == nil {
			obs.Trace += "\nnode ruleset (nft -a list ruleset):\n" + rs
		}
	}
	return obs, nil
}

// namespace returns the namespace of a place.
func (b *Backend) namespace(pl Place) *lab.NS {
	switch pl.Origin {
	case features.FromNode:
		return b.lab.Node
	case features.FromExternal:
		return b.lab.Client
	}
	return b.lab.Pod(pl.Pod).NS
}

func (b *Backend) timeout() time.Duration {
	if b.Timeout > 0 {
		return b.Timeout
	}
	return DefaultTimeout
}

// sample sends p as connections, as many as exp calls for (see minSamples). Between the
// connections of a non-sticky expectation the client is removed from the affinity sets of
// the Service it reaches, so that each connection is a new client's, as the simulator's
// branches are; the last connection's affinity stays.
func (b *Backend) sample(ns *lab.NS, proto lab.Proto, p packet.Packet, exp *features.Expect) ([]sample, error) {
	n, least := 1, 1
	switch {
	case len(exp.Endpoints) > 0 && exp.Sticky:
		n, least = stickySamples, stickySamples
	case len(exp.Endpoints) > 0:
		n, least = samplesPerEndpoint*len(exp.Endpoints), minSamples
	}
	var sets []string
	if n > 1 && !exp.Sticky {
		var err error
		if sets, err = b.affinitySets(p); err != nil {
			return nil, err
		}
	}
	fromNode := ns == b.lab.Node
	if fromNode {
		n = min(n, nodePorts)
	}
	var out []sample
	for i := range n {
		src := p.Src
		if i > 0 {
			src = netip.AddrPortFrom(p.Src.Addr(), 0)
			if err := b.forget(p.Src.Addr(), p, sets); err != nil {
				return nil, err
			}
		}
		if fromNode {
			src = netip.AddrPortFrom(p.Src.Addr(), nodePortBase+uint16(i))
		}
		s, err := b.exchange(ns, proto, src, p.Dst)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
		if s.outcome != lab.Answered || (i+1 >= least && !exp.Sticky && answeredAll(out, exp.Endpoints, p.Dst)) {
			break
		}
	}
	return out, nil
}

// answeredAll reports whether every endpoint in want answered one of ss.
func answeredAll(ss []sample, want []netip.AddrPort, dst netip.AddrPort) bool {
	for _, w := range want {
		if !slices.ContainsFunc(ss, func(s sample) bool { return s.dnat(dst) && s.endpoint == w }) {
			return false
		}
	}
	return true
}

// exchange makes one connection and finds where the node sent it.
func (b *Backend) exchange(ns *lab.NS, proto lab.Proto, src, dst netip.AddrPort) (sample, error) {
	s := sample{src: src}
	timeout := b.timeout()
	if proto == lab.TCP && dst.Addr().Is6() {
		timeout = max(timeout, ipv6TCPTimeout)
	}
	s.reply, s.err = ns.Echo(lab.Request{Proto: proto, Src: src, Dst: dst, Timeout: timeout})
	s.outcome = lab.Classify(s.err)
	if s.outcome == lab.Failed && errors.Is(s.err, unix.EPERM) {
		// The node's own packet was dropped on its output path.
		s.outcome, s.note = lab.TimedOut, "EPERM: dropped on the node's output path"
	}
	if s.outcome == lab.Failed {
		return s, s.err
	}
	if s.outcome == lab.TimedOut {
		var err error
		s.void, err = b.obs.voided()
		return s, err
	}
	if s.outcome != lab.Answered {
		return s, nil
	}
	ep, err := b.replySource(proto, s.reply.Local, dst)
	if err != nil {
		return s, err
	}
	s.endpoint = ep
	if !ep.IsValid() {
		s.note = "no conntrack entry on the node"
		if a, ok := b.topo.PodAddrs[s.reply.Pod]; ok {
			if ports := b.podPorts(s.reply.Pod); len(ports) == 1 {
				s.endpoint = netip.AddrPortFrom(a, ports[0])
			}
		}
	} else if a, ok := b.topo.PodAddrs[s.reply.Pod]; ok && a != ep.Addr() {
		s.note = fmt.Sprintf("pod %s answered, but the node's conntrack sent the connection to %s", s.reply.Pod, ep)
	}
	return s, nil
}

func (b *Backend) podPorts(name string) []uint16 {
	for _, ps := range [][]lab.PodSpec{b.lab.Spec.Pods, remotePods(b.lab.Spec)} {
		for _, p := range ps {
			if p.Name == name {
				return p.Ports
			}
		}
	}
	return nil
}

func remotePods(s lab.Spec) []lab.PodSpec {
	if s.Remote == nil {
		return nil
	}
	return s.Remote.Pods
}

// replySource looks up, in the node's conntrack, the connection from local to dst and
// returns the source of its reply direction: the endpoint after DNAT, or dst itself. It
// returns the zero AddrPort when there is no such connection.
func (b *Backend) replySource(proto lab.Proto, local, dst netip.AddrPort) (netip.AddrPort, error) {
	num := map[lab.Proto]uint8{lab.TCP: unix.IPPROTO_TCP, lab.UDP: unix.IPPROTO_UDP, lab.SCTP: unix.IPPROTO_SCTP}[proto]
	family := netlink.InetFamily(unix.AF_INET)
	if dst.Addr().Is6() {
		family = unix.AF_INET6
	}
	var found netip.AddrPort
	err := b.lab.Node.Do(func() error {
		flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, family)
		if err != nil {
			return fmt.Errorf("list conntrack: %w", err)
		}
		for _, f := range flows {
			t := f.Forward
			if t.Protocol == num && ipEqual(t.SrcIP, local.Addr()) && t.SrcPort == local.Port() &&
				ipEqual(t.DstIP, dst.Addr()) && t.DstPort == dst.Port() {
				a, _ := netip.AddrFromSlice(f.Reverse.SrcIP)
				found = netip.AddrPortFrom(a.Unmap(), f.Reverse.SrcPort)
			}
		}
		return nil
	})
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("netns %s: %w", b.lab.Node, err)
	}
	return found, nil
}

func ipEqual(ip net.IP, a netip.Addr) bool {
	b, ok := netip.AddrFromSlice(ip)
	return ok && b.Unmap() == a
}

// observe reduces the samples of a Send to an Observation. Where samples differ in
// source or masquerading, the first one that contradicts exp speaks for all.
func observe(p packet.Packet, exp *features.Expect, ss []sample) *features.Observation {
	obs := &features.Observation{}
	var rep *sample
	for i := range ss {
		s := &ss[i]
		switch v := s.verdict(); {
		case obs.Verdict == "":
			obs.Verdict = v
		case obs.Verdict != v:
			obs.Verdict = "mixed"
		}
		if s.voided() {
			obs.DNAT = obs.DNAT || s.void.dnat > 0
			obs.Masquerade = obs.Masquerade || s.void.snat > 0
			continue
		}
		if s.outcome != lab.Answered {
			continue
		}
		if s.local() {
			obs.Local = true
		}
		if s.dnat(p.Dst) {
			obs.DNAT = true
			if !slices.Contains(obs.Endpoints, s.endpoint) {
				obs.Endpoints = append(obs.Endpoints, s.endpoint)
			}
			obs.Chosen = s.endpoint
		}
		if rep == nil || (!contradicts(exp, *rep) && contradicts(exp, *s)) {
			rep = s
		}
	}
	if rep != nil {
		obs.Masquerade = obs.Masquerade || rep.masquerade()
		obs.Source = rep.reply.Source.Addr()
	}
	return obs
}

// contradicts reports whether a sample's masquerading or source contradicts exp.
func contradicts(exp *features.Expect, s sample) bool {
	return (exp.Masquerade != nil && *exp.Masquerade != s.masquerade()) ||
		(exp.Source != nil && *exp.Source != s.reply.Source.Addr())
}

// account describes the samples and the node's trace lines since mark, after waiting
// for late trace events if wait is set.
func (b *Backend) account(p packet.Packet, ns *lab.NS, ss []sample, mark int, wait bool) string {
	var w strings.Builder
	fmt.Fprintf(&w, "kernel lab %s: %s sent from netns %s as %d connection(s):\n", b.lab.ID, p, ns, len(ss))
	for i, s := range ss {
		fmt.Fprintf(&w, "  #%d from %s: ", i+1, s.src)
		switch {
		case s.voided():
			fmt.Fprintf(&w, "no answer: the node sent %d packet(s) on into void0, the lab's route to nowhere "+
				"(%d of a DNATed connection, %d masqueraded)", s.void.all, s.void.dnat, s.void.snat)
		case s.outcome != lab.Answered:
			fmt.Fprintf(&w, "%s (%v)", s.outcome, s.err)
		case s.local():
			fmt.Fprintf(&w, "answered by the node itself, which saw %s (client socket %s)", s.reply.Source, s.reply.Local)
		default:
			fmt.Fprintf(&w, "answered by pod %s (conntrack: to %s), which saw %s (client socket %s)",
				s.reply.Pod, s.endpoint, s.reply.Source, s.reply.Local)
		}
		if s.note != "" {
			fmt.Fprintf(&w, " [%s]", s.note)
		}
		w.WriteString("\n")
	}
	if b.trace == nil {
		return w.String()
	}
	if wait {
		// Events reach the monitor asynchronously; give the last ones a moment.
		time.Sleep(50 * time.Millisecond)
	}
	lines := b.trace.Lines()[mark:]
	fmt.Fprintf(&w, "nft monitor trace in the node (%d lines):\n", len(lines))
	for i, l := range lines {
		if i == maxTraceLines {
			fmt.Fprintf(&w, "  ... %d more lines\n", len(lines)-i)
			break
		}
		fmt.Fprintf(&w, "  %s\n", l)
	}
	return w.String()
}

// affinitySets returns the node's affinity sets when p reaches a Service port with
// session affinity: the sets that remember which endpoint each client . frontend was
// sent to.
func (b *Backend) affinitySets(p packet.Packet) ([]string, error) {
	if !slices.ContainsFunc(frontends(b.st, b.sc.Node.Addresses, p), func(fp frontendPort) bool { return fp.svc.AffinityTimeout > 0 }) {
		return nil, nil
	}
	nft := b.nfts[familyOf(p)]
	names, err := nft.List(context.Background(), "sets")
	if err != nil {
		return nil, fmt.Errorf("list sets of the node's table: %w", err)
	}
	var out []string
	for _, n := range names {
		if strings.HasPrefix(n, ruleset.SetAffinityClients) || strings.HasPrefix(n, ruleset.SetAffinityLocalClients) {
			out = append(out, n)
		}
	}
	return out, nil
}

// forget removes the record of client for p's frontend from the given affinity sets
// of the node. Adding the element first makes the deletion succeed whether or not
// the client was in the set, in one nft run.
func (b *Backend) forget(client netip.Addr, p packet.Packet, sets []string) error {
	if len(sets) == 0 {
		return nil
	}
	nft := b.nfts[familyOf(p)]
	key := []string{client.String(), p.Dst.Addr().String(), p.Protocol.String(), strconv.Itoa(int(p.Dst.Port()))}
	tx := nft.NewTransaction()
	for _, set := range sets {
		tx.Add(&knftables.Element{Set: set, Key: key})
		tx.Delete(&knftables.Element{Set: set, Key: key})
	}
	if err := nft.Run(context.Background(), tx); err != nil {
		return fmt.Errorf("forget client %s of %s in affinity sets %s: %w", client, p.Dst, strings.Join(sets, ", "), err)
	}
	return nil
}

func familyOf(p packet.Packet) knftables.Family {
	if p.Dst.Addr().Is6() {
		return knftables.IPv6Family
	}
	return knftables.IPv4Family
}

// frontendPort is a Service port reached through one of its frontends.
type frontendPort struct {
	svc  *state.Service
	port state.ServicePort
}

// frontends returns the Service ports whose ClusterIP, ExternalIP or load-balancer IP and
// port, or node port on one of nodeAddrs, is p's destination.
func frontends(st *state.ClusterState, nodeAddrs []netip.Addr, p packet.Packet) []frontendPort {
	if st == nil {
		return nil
	}
	dst := p.Dst.Addr()
	isNode := slices.Contains(nodeAddrs, dst)
	var out []frontendPort
	for _, name := range sortedServiceNames(st.Services) {
		svc := st.Services[name]
		vip := slices.Contains(svc.ClusterIPs, dst) || slices.Contains(svc.ExternalIPs, dst) ||
			slices.Contains(svc.LoadBalancerIPs, dst)
		for _, sp := range svc.Ports {
			if string(sp.Protocol) != p.Protocol.String() {
				continue
			}
			if (vip && sp.Port == p.Dst.Port()) || (isNode && sp.NodePort != 0 && sp.NodePort == p.Dst.Port()) {
				out = append(out, frontendPort{svc: svc, port: sp})
			}
		}
	}
	return out
}

// affinityServices names the Service ports with session affinity that p reaches.
func affinityServices(st *state.ClusterState, nodeAddrs []netip.Addr, p packet.Packet) []string {
	var out []string
	for _, fp := range frontends(st, nodeAddrs, p) {
		if fp.svc.AffinityTimeout > 0 {
			out = append(out, ruleset.PortID(fp.svc, fp.port))
		}
	}
	return out
}
