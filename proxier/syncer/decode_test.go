package syncer

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/nftdata"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
)

// dualConfig is testConfig with a cluster and a service range of each family.
var dualConfig = func() ruleset.Config {
	c := ruleset.Config{
		LocalMode:    ruleset.LocalClusterCIDR,
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd01::/48")},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("172.30.0.0/16"), netip.MustParsePrefix("fd02::/112")},
	}
	c.Defaults()
	return c
}()

// dualCluster returns a dual-stack cluster with n Services cycling through every
// kind the builder knows (ClusterIP, with local internal policy or affinity,
// NodePort, LoadBalancer with source ranges and local external policy, external
// IPs) and the three protocols, each with endpoints of both families on this node
// and another.
func dualCluster(n int) *state.ClusterState {
	st := state.NewClusterState()
	st.Node = state.Node{Name: "node-a", Zone: "z1", Addresses: []netip.Addr{
		netip.MustParseAddr("192.168.0.10"), netip.MustParseAddr("fd00:192:168::10")}}
	protos := []state.Protocol{state.TCP, state.UDP, state.SCTP}
	for i := range n {
		name := state.ServiceName{Namespace: "ns", Name: fmt.Sprintf("svc-%d", i)}
		v4 := func(a, b byte) netip.Addr { return netip.AddrFrom4([4]byte{a, b, byte(i / 250), byte(i%250 + 1)}) }
		v6 := func(prefix string) netip.Addr { return netip.MustParseAddr(fmt.Sprintf("%s%x", prefix, i+1)) }
		proto := protos[i%3]
		svc := &state.Service{
			Name: name, Type: "ClusterIP",
			ClusterIPs: []netip.Addr{v4(172, 30), v6("fd02::")},
			Ports:      []state.ServicePort{{Name: "p", Protocol: proto, Port: uint16(80 + i%3)}},
		}
		switch i % 7 {
		case 1:
			svc.InternalPolicyLocal = true
		case 2:
			svc.AffinityTimeout = time.Hour
		case 3:
			svc.Type = "NodePort"
			svc.Ports[0].NodePort = uint16(30000 + i)
		case 4:
			svc.Type = "NodePort"
			svc.Ports[0].NodePort = uint16(30000 + i)
			svc.ExternalPolicyLocal = true
			svc.HealthCheckNodePort = uint16(32000 + i)
		case 5:
			svc.Type = "LoadBalancer"
			svc.Ports[0].NodePort = uint16(30000 + i)
			svc.LoadBalancerIPs = []netip.Addr{v4(203, 0), v6("2001:db8::")}
			svc.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("2001:db8:1::/48")}
		case 6:
			svc.ExternalIPs = []netip.Addr{v4(192, 0), v6("2001:db8:2::")}
		}
		st.Services[name] = svc
		st.Slices[name] = map[string]*state.EndpointSlice{}
		for _, six := range []bool{false, true} {
			sl := &state.EndpointSlice{Name: fmt.Sprintf("%s-%v", name.Name, six), Service: name, IPv6: six,
				Ports: []state.EndpointPort{{Name: "p", Protocol: proto, Port: 8080}}}
			for j := range 1 + i%3 {
				a := netip.AddrFrom4([4]byte{10, byte(1 + j), byte(i / 250), byte(i%250 + 1)})
				if six {
					a = netip.MustParseAddr(fmt.Sprintf("fd01::%x:%x", j+1, i+1))
				}
				sl.Endpoints = append(sl.Endpoints, state.SliceEndpoint{Address: a, Ready: true, Serving: true,
					NodeName: []string{"node-a", "node-b"}[j%2]})
			}
			st.Slices[name][sl.Name] = sl
		}
	}
	return st
}

// sortedElements returns the elements of container name of rs, ordered by key.
func sortedElements(rs *ruleset.Ruleset, name string) []*knftables.Element {
	var es []*knftables.Element
	for k, e := range rs.Elements[name] {
		es = append(es, ruleset.ToElement(name, rs.IsMap(name), k, e))
	}
	slices.SortFunc(es, func(a, b *knftables.Element) int {
		return strings.Compare(ruleset.ElementKey(a), ruleset.ElementKey(b))
	})
	return es
}

// mergeOps joins consecutive operations of one verb on one set or map: the
// encoder splits long element lists into several messages.
func mergeOps(ops []ElementOp) []ElementOp {
	var out []ElementOp
	for _, op := range ops {
		if n := len(out); n > 0 && out[n-1].Verb == op.Verb && op.Verb != ElementFlush &&
			out[n-1].Set == op.Set && out[n-1].Map == op.Map {
			out[n-1].Elements = append(out[n-1].Elements, op.Elements...)
			continue
		}
		op.Elements = slices.Clone(op.Elements)
		out = append(out, op)
	}
	return out
}

// TestDecodeElementBatchRoundTrip encodes flushes, deletions and additions of the
// elements of every set and map of built rulesets of both families that go over
// netlink, frames them as writeElements does, and checks that decoding the batch
// gives the operations back in the ruleset's own text.
func TestDecodeElementBatchRoundTrip(t *testing.T) {
	for _, family := range []knftables.Family{knftables.IPv4Family, knftables.IPv6Family} {
		t.Run(string(family), func(t *testing.T) {
			rs := ruleset.Build(dualCluster(70), dualConfig, family)
			conts := netlinkContainers(rs)
			var ops []elementOps
			var want []ElementOp
			for i, c := range conts {
				es := sortedElements(rs, c.name)
				del := es[:len(es)/3]
				ops = append(ops, elementOps{c: c, flush: i%2 == 0, del: slices.Values(del), add: slices.Values(es), n: len(del) + len(es)})
				base := ElementOp{Family: family, Table: rs.Table, Set: rs.Sets[c.name], Map: rs.Maps[c.name]}
				if i%2 == 0 {
					op := base
					op.Verb = ElementFlush
					want = append(want, op)
				}
				if len(del) > 0 {
					op := base
					op.Verb = ElementDelete
					for _, e := range del {
						op.Elements = append(op.Elements, &knftables.Element{Set: e.Set, Map: e.Map, Key: e.Key})
					}
					want = append(want, op)
				}
				op := base
				op.Verb, op.Elements = ElementAdd, es
				want = append(want, op)
			}
			f, _, n, err := frameElements(rs, ops)
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodeElementBatch(f.bufs, definitionsOf(rs))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, mergeOps(got)); diff != "" {
				t.Fatalf("decoded batch of %d elements (-encoded +decoded):\n%s", n, diff)
			}
			checkCoverage(t, rs, conts, got)
		})
	}
}

// checkCoverage fails unless the decoded ops hold what the round trip is meant to
// cover: sets and maps, concatenations, comments, the family's addresses and
// every protocol.
func checkCoverage(t *testing.T, rs *ruleset.Ruleset, conts []*container, ops []ElementOp) {
	t.Helper()
	var sets, maps, concats, comments int
	text := ""
	for _, op := range ops {
		for _, e := range op.Elements {
			if e.Map != "" {
				maps++
			} else {
				sets++
			}
			if len(e.Key) > 1 {
				concats++
			}
			if e.Comment != nil {
				comments++
			}
			text += " " + strings.Join(append(slices.Clone(e.Key), e.Value...), " ") + " "
		}
	}
	addr := " 10."
	if rs.Family == knftables.IPv6Family {
		addr = " fd01::"
	}
	for _, s := range []string{addr, " tcp ", " udp ", " sctp "} {
		if !strings.Contains(text, s) {
			t.Errorf("no decoded element holds %q", s)
		}
	}
	if sets == 0 || maps == 0 || concats == 0 || comments == 0 || len(conts) < 5 {
		t.Errorf("decoded %d set and %d map elements, %d concatenations, %d comments in %d containers; want all kinds",
			sets, maps, concats, comments, len(conts))
	}
}

// TestDecodedBatchOnAFake applies a decoded full sync to a knftables.Fake holding
// stale elements and checks that the Fake then holds the ruleset's elements.
func TestDecodedBatchOnAFake(t *testing.T) {
	ctx := context.Background()
	for _, family := range []knftables.Family{knftables.IPv4Family, knftables.IPv6Family} {
		rs := ruleset.Build(dualCluster(30), dualConfig, family)
		conts := netlinkContainers(rs)
		fake := knftables.NewFake(family, rs.Table)
		tx := fake.NewTransaction()
		tx.Add(&knftables.Table{})
		for _, c := range conts {
			if s := rs.Sets[c.name]; s != nil {
				tx.Add(s)
			} else {
				tx.Add(rs.Maps[c.name])
			}
		}
		// A stale element in each, which the flush removes.
		old := ruleset.Build(dualCluster(35), dualConfig, family)
		for _, c := range conts {
			es := sortedElements(old, c.name)
			tx.Add(es[len(es)-1])
		}
		if err := fake.Run(ctx, tx); err != nil {
			t.Fatal(err)
		}
		f, _, _, err := frameElements(rs, fullOps(rs, conts))
		if err != nil {
			t.Fatal(err)
		}
		ops, err := DecodeElementBatch(f.bufs, definitionsOf(rs))
		if err != nil {
			t.Fatal(err)
		}
		tx = fake.NewTransaction()
		for i := range ops {
			ops[i].Queue(tx)
		}
		if err := fake.Run(ctx, tx); err != nil {
			t.Fatal(err)
		}
		for _, c := range conts {
			typ := "set"
			if rs.Maps[c.name] != nil {
				typ = "map"
			}
			got, err := fake.ListElements(ctx, typ, c.name)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range got {
				e.Family, e.Table = "", ""
			}
			slices.SortFunc(got, func(a, b *knftables.Element) int {
				return strings.Compare(ruleset.ElementKey(a), ruleset.ElementKey(b))
			})
			if diff := cmp.Diff(sortedElements(rs, c.name), got); diff != "" {
				t.Errorf("%s %s in the Fake (-ruleset +fake):\n%s", family, c.name, diff)
			}
		}
	}
}

// TestFirewallAllowRanges checks the one interval set, whose elements nft writes
// (the loader leaves intervals to it): each element's key, prefixes included,
// comes back from the kernel's encoding of its first and last value.
func TestFirewallAllowRanges(t *testing.T) {
	for _, family := range []knftables.Family{knftables.IPv4Family, knftables.IPv6Family} {
		rs := ruleset.Build(dualCluster(30), dualConfig, family)
		set := rs.Sets[ruleset.SetFirewallAllow]
		if _, err := containerOf(set, nil); err == nil {
			t.Errorf("%s: the loader takes the interval set %s", family, set.Name)
		}
		l, err := nftdata.ParseLayout(set.Type)
		if err != nil {
			t.Fatal(err)
		}
		es := sortedElements(rs, set.Name)
		if len(es) == 0 {
			t.Fatalf("%s: no %s elements", family, set.Name)
		}
		for _, e := range es {
			lo, hi, err := l.EncodeRange(e.Key)
			if err != nil {
				t.Fatalf("%s %q: %v", family, e.Key, err)
			}
			if !strings.Contains(e.Key[len(e.Key)-1], "/") || slices.Equal(lo, hi) {
				t.Errorf("%s %q: not a prefix range", family, e.Key)
			}
			got, err := l.DecodeRange(lo, hi)
			if err != nil || !slices.Equal(got, e.Key) {
				t.Errorf("%s %q: decoded as %q, %v", family, e.Key, got, err)
			}
		}
	}
}

// TestDecodeElementMessageErrors checks that what the decoder cannot represent is
// refused with the set and the reason named.
func TestDecodeElementMessageErrors(t *testing.T) {
	rs := ruleset.Build(dualCluster(10), dualConfig, knftables.IPv4Family)
	c, err := containerOf(nil, rs.Maps[sortedMaps(rs)[0]])
	if err != nil {
		t.Fatal(err)
	}
	es := sortedElements(rs, c.name)
	w, err := encodeOps(unix.NFPROTO_IPV4, rs.Table, &elementOps{c: c, add: slices.Values(es[:1]), n: 1})
	if err != nil {
		t.Fatal(err)
	}
	msg := w.b
	if op, err := DecodeElementMessage(msg, definitionsOf(rs)); err != nil || len(op.Elements) != 1 {
		t.Fatalf("decoding one element: %+v, %v", op, err)
	}
	// A timeout attribute appended to the element: the nests grow by its 12 bytes.
	withTimeout := slices.Clone(msg)
	withTimeout = binary.NativeEndian.AppendUint16(withTimeout, 12)
	withTimeout = binary.NativeEndian.AppendUint16(withTimeout, unix.NFTA_SET_ELEM_TIMEOUT)
	withTimeout = binary.BigEndian.AppendUint64(withTimeout, 1000)
	binary.NativeEndian.PutUint32(withTimeout, uint32(len(withTimeout)))
	for _, off := range nestOffsets(t, msg) {
		binary.NativeEndian.PutUint16(withTimeout[off:], binary.NativeEndian.Uint16(withTimeout[off:])+12)
	}
	for _, tc := range []struct {
		name   string
		msg    []byte
		lookup func(string) (*knftables.Set, *knftables.Map)
		want   string
	}{
		{"unknown map", msg, func(string) (*knftables.Set, *knftables.Map) { return nil, nil }, fmt.Sprintf("no set or map %q", c.name)},
		{"typeof map", msg, func(string) (*knftables.Set, *knftables.Map) {
			return nil, &knftables.Map{Name: c.name, TypeOf: "ip daddr : ip daddr"}
		}, "typeof"},
		{"wrong type", msg, func(string) (*knftables.Set, *knftables.Map) {
			return nil, &knftables.Map{Name: c.name, Type: "ipv4_addr : ipv4_addr . inet_service"}
		}, c.name + ": element 0: key: 12 bytes where the type ipv4_addr takes 4"},
		{"truncated", msg[:len(msg)-3], definitionsOf(rs), ""},
		{"timeout", withTimeout, definitionsOf(rs), fmt.Sprintf("attribute %d is not decoded", unix.NFTA_SET_ELEM_TIMEOUT)},
	} {
		_, err := DecodeElementMessage(tc.msg, tc.lookup)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v; want one containing %q", tc.name, err, tc.want)
		}
	}
	if _, err := DecodeElementBatch([][]byte{msg}, definitionsOf(rs)); err == nil || !strings.Contains(err.Error(), "NFNL_MSG_BATCH_BEGIN") {
		t.Errorf("unframed batch: error %v; want one about the framing", err)
	}
}

// sortedMaps returns the names of the maps of rs in order.
func sortedMaps(rs *ruleset.Ruleset) []string { return ruleset.SortedKeys(rs.Maps) }

// nestOffsets returns where the nests that hold the last element of msg, a
// one-element message, start: the element list and the element.
func nestOffsets(t *testing.T, msg []byte) []int {
	t.Helper()
	var offs []int
	for off := 20; off < len(msg); {
		l, typ := int(binary.NativeEndian.Uint16(msg[off:])), binary.NativeEndian.Uint16(msg[off+2:])&^(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER)
		if typ == unix.NFTA_SET_ELEM_LIST_ELEMENTS && l > 8 && off+l == len(msg) {
			offs = append(offs, off, off+4)
			return offs
		}
		off += (l + 3) &^ 3
	}
	t.Fatal("no element list in the message")
	return nil
}
