package syncer

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/e2e/lab"
	"github.com/nftproxy/nftproxy/nftdata"
	"github.com/nftproxy/nftproxy/proxier/changeset"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
)

// TestLayoutEncode checks the bytes of keys and values: concatenations take 32-bit
// registers per field, a single field its own length.
func TestLayoutEncode(t *testing.T) {
	for _, tc := range []struct {
		typ    string
		fields []string
		want   string
	}{
		{"ipv4_addr . inet_proto . inet_service", []string{"10.0.0.1", "tcp", "80"}, "0a000001" + "06000000" + "00500000"},
		{"ipv4_addr . inet_proto . inet_service", []string{"10.0.0.1 . udp . 53"}, "0a000001" + "11000000" + "00350000"},
		{"inet_proto . inet_service", []string{"sctp", "30000"}, "84000000" + "75300000"},
		{"inet_proto . inet_service", []string{"47", "1"}, "2f000000" + "00010000"},
		{"inet_service", []string{"8080"}, "1f90"},
		{"ipv4_addr", []string{"192.0.2.1"}, "c0000201"},
		{"ipv4_addr . inet_service", []string{"10.1.0.5", "8443"}, "0a010005" + "20fb0000"},
		{"ipv6_addr . ipv6_addr", []string{"fd00::1", "fd00::1"}, "fd000000000000000000000000000001" + "fd000000000000000000000000000001"},
	} {
		l, err := nftdata.ParseLayout(tc.typ)
		if err != nil {
			t.Fatalf("%s: %v", tc.typ, err)
		}
		b, err := l.Encode(nil, tc.fields)
		if err != nil {
			t.Fatalf("%s %q: %v", tc.typ, tc.fields, err)
		}
		if got := hex.EncodeToString(b); got != tc.want {
			t.Errorf("%s %q = %s; want %s", tc.typ, tc.fields, got, tc.want)
		}
	}
}

// TestEncodeErrors checks that what the loader cannot encode is refused with the
// element, the container and the field named, and that containers whose elements
// are left to nft are recognised.
func TestEncodeErrors(t *testing.T) {
	c, err := containerOf(nil, &knftables.Map{Name: "backends-0", Type: "ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		e    knftables.Element
		want string
	}{
		{knftables.Element{Key: []string{"10.0.0.300", "tcp", "80"}, Value: []string{"10.1.0.1", "80"}},
			`element "10.0.0.300 . tcp . 80" of backends-0: key: field 1 (ipv4_addr): bad ipv4_addr value "10.0.0.300"`},
		{knftables.Element{Key: []string{"fd00::1", "tcp", "80"}, Value: []string{"10.1.0.1", "80"}},
			`element "fd00::1 . tcp . 80" of backends-0: key: field 1 (ipv4_addr): bad ipv4_addr value "fd00::1"`},
		{knftables.Element{Key: []string{"10.0.0.1", "tpc", "80"}, Value: []string{"10.1.0.1", "80"}},
			`key: field 2 (inet_proto): bad inet_proto value "tpc"`},
		{knftables.Element{Key: []string{"10.0.0.1", "tcp", "80-90"}, Value: []string{"10.1.0.1", "80"}},
			`key: field 3 (inet_service): bad inet_service value "80-90"`},
		{knftables.Element{Key: []string{"10.0.0.1", "tcp"}, Value: []string{"10.1.0.1", "80"}},
			`key: 2 fields where the type ipv4_addr . inet_proto . inet_service has 3`},
		{knftables.Element{Key: []string{"10.0.0.1", "tcp", "80"}},
			`a value is needed exactly for map elements`},
		{knftables.Element{Key: []string{"10.0.0.1", "tcp", "80"}, Value: []string{"10.1.0.1", "65536"}},
			`value: field 2 (inet_service): bad inet_service value "65536"`},
		{knftables.Element{Key: []string{"10.0.0.1", "tcp", "80"}, Value: []string{"10.1.0.1", "80"}, Comment: knftables.PtrTo(strings.Repeat("x", 255))},
			`comment of 255 bytes is too long`},
	} {
		_, err := c.appendElement(nil, &tc.e, false)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("element %q: error %v; want one containing %q", tc.e.Key, err, tc.want)
		}
	}
	for _, tc := range []struct {
		set  *knftables.Set
		want string
	}{
		{&knftables.Set{Name: "firewall-allow", Type: "ipv4_addr . ipv4_addr", Flags: []knftables.SetFlag{knftables.IntervalFlag}}, "interval"},
		{&knftables.Set{Name: "t", TypeOf: "ip daddr"}, "typeof"},
		{&knftables.Set{Name: "e", Type: "ether_addr"}, `field 1 "ether_addr"`},
		{&knftables.Set{Name: "v", Type: "inet_service : verdict"}, "verdict fields are left to nft"},
	} {
		if _, err := containerOf(tc.set, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("set %s: error %v; want one containing %q", tc.set.Name, err, tc.want)
		}
	}
}

// netlinkNFT returns a namespace and a real nft for testConfig's table in it, and
// a Syncer that loads elements over netlink into that namespace.
func netlinkSyncer(t *testing.T, name string, family knftables.Family, opts ...Option) (*lab.NS, knftables.Interface, *Syncer) {
	t.Helper()
	ns, _ := kernelNFT(t, name)
	nft, err := lab.NFT(ns, family, testConfig.Table, knftables.UseNetlink)
	if err != nil {
		t.Fatal(err)
	}
	return ns, nft, New(nft, append([]Option{WithNetlink(KernelNetlink(ns.Do))}, opts...)...)
}

// listTable returns nft's listing of testConfig's table of family in ns.
func listTable(t *testing.T, ns *lab.NS, family knftables.Family) string {
	t.Helper()
	out, err := ns.Exec(context.Background(), "", "nft", "list", "table", string(family), testConfig.Table)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestKernelNetlinkFullSync loads a ruleset's elements over netlink into a new
// table and checks that nft lists the table exactly as it lists the same ruleset
// written by nft alone, in another namespace: keys, values and comments.
func TestKernelNetlinkFullSync(t *testing.T) {
	ctx := context.Background()
	rs := ruleset.Build(cluster(60), testConfig, knftables.IPv4Family)
	ns, nft, s := netlinkSyncer(t, "nl", knftables.IPv4Family)
	res, err := s.Sync(ctx, rs)
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, c := range netlinkContainers(rs) {
		want += len(rs.Elements[c.name])
	}
	if res.NetlinkElements != want || want < 100 {
		t.Errorf("NetlinkElements = %d; want %d (all elements but those left to nft)", res.NetlinkElements, want)
	}
	if res.Fallback != nil {
		t.Errorf("Fallback = %v", res.Fallback)
	}
	checkKernelTable(t, nft, rs, nil)

	refNS, refNFT := kernelNFT(t, "nlref")
	if res, err := New(refNFT).Sync(ctx, rs); err != nil || res.NetlinkElements != 0 {
		t.Fatalf("reference sync through nft: %+v, %v", res, err)
	}
	if diff := cmp.Diff(listTable(t, refNS, knftables.IPv4Family), listTable(t, ns, knftables.IPv4Family)); diff != "" {
		t.Errorf("nft's listing of the table loaded over netlink (-nft only +netlink):\n%s", diff)
	}
}

// TestKernelNetlinkIPv6 is TestKernelNetlinkFullSync for an ip6 table with every
// field type of the IPv6 ruleset.
func TestKernelNetlinkIPv6(t *testing.T) {
	ctx := context.Background()
	rs := ruleset.New(knftables.IPv6Family, testConfig.Table)
	rs.AddSet(&knftables.Set{Name: "ips", Type: "ipv6_addr . inet_proto . inet_service"})
	rs.AddSet(&knftables.Set{Name: "hairpin", Type: "ipv6_addr . ipv6_addr"})
	rs.AddSet(&knftables.Set{Name: "ports", Type: "inet_proto . inet_service"})
	rs.AddMap(&knftables.Map{Name: "backends", Type: "ipv6_addr . inet_proto . inet_service : ipv6_addr . inet_service"})
	for i := range 300 {
		vip, ep := fmt.Sprintf("fd00:30::%x", i), fmt.Sprintf("fd00:1:%x::5", i)
		rs.AddKnftElement(&knftables.Element{Set: "ips", Key: []string{vip, "udp", "53"}, Comment: knftables.PtrTo(fmt.Sprintf("ns/svc-%d/udp/dns", i))})
		rs.AddKnftElement(&knftables.Element{Set: "hairpin", Key: []string{ep, ep}})
		rs.AddKnftElement(&knftables.Element{Set: "ports", Key: []string{"sctp", fmt.Sprint(30000 + i)}})
		rs.AddKnftElement(&knftables.Element{Map: "backends", Key: []string{vip, "udp", "53"}, Value: []string{ep, "5353"}})
	}
	ns, _, s := netlinkSyncer(t, "nl6", knftables.IPv6Family)
	if res, err := s.Sync(ctx, rs); err != nil || res.NetlinkElements != 1200 {
		t.Fatalf("sync: %+v, %v; want 1200 elements over netlink", res, err)
	}
	refNS, _ := kernelNFT(t, "nl6ref")
	refNFT, err := lab.NFT(refNS, knftables.IPv6Family, testConfig.Table)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(refNFT).Sync(ctx, rs); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(listTable(t, refNS, knftables.IPv6Family), listTable(t, ns, knftables.IPv6Family)); diff != "" {
		t.Errorf("nft's listing of the ip6 table loaded over netlink (-nft only +netlink):\n%s", diff)
	}
}

// TestKernelNetlinkResync checks when a full sync over an existing table loads its
// elements over netlink: when the Syncer applied the table's rules itself and they
// stay (a periodic resync, which also repairs elements changed behind its back),
// or a new Syncer adopts a table that has every object it wants; not when the
// rules change, nor when the adopted table lacks an object.
func TestKernelNetlinkResync(t *testing.T) {
	ctx := context.Background()
	st := cluster(40)
	b := changeset.NewBuilder(testConfig, knftables.IPv4Family)
	ns, nft, s := netlinkSyncer(t, "nlre", knftables.IPv4Family)
	rs, d := b.Update(st, nil)
	if res, err := s.Apply(ctx, rs, d); err != nil || res.NetlinkElements == 0 {
		t.Fatalf("first sync: %+v, %v; want elements over netlink", res, err)
	}
	// Element changes only, then a drifted element and a missing one.
	for i, n := range []int{3, 0, 2} {
		st = clone(st)
		name := state.ServiceName{Namespace: "ns", Name: fmt.Sprintf("svc-%d", i)}
		setEndpoints(st, name, i, n)
		rs, d = b.Update(st, map[state.ServiceName]bool{name: true})
		if res, err := s.Apply(ctx, rs, d); err != nil || res.Full {
			t.Fatalf("update %d: %+v, %v; want incremental", i, res, err)
		}
	}
	if err := ns.NFTApply(ctx, fmt.Sprintf("add element ip %s %s { 10.9.9.9 }\nflush set ip %s %s\n",
		testConfig.Table, ruleset.SetClusterIPs, testConfig.Table, ruleset.SetHairpin)); err != nil {
		t.Fatal(err)
	}
	s.RequestFullSync()
	res, err := s.Apply(ctx, rs, d)
	if err != nil || !res.Full || res.NetlinkElements == 0 {
		t.Fatalf("resync: %+v, %v; want a full sync with elements over netlink", res, err)
	}
	checkKernelTable(t, nft, rs, nil)

	// A change of rules: one Service gets a new endpoint count, which adds chains.
	st = clone(st)
	name := state.ServiceName{Namespace: "ns", Name: "svc-7"}
	setEndpoints(st, name, 7, 23)
	rs, d = b.Update(st, map[state.ServiceName]bool{name: true})
	before := s.structureOf(rs)
	s.RequestFullSync()
	if res, err := s.Apply(ctx, rs, d); err != nil || !res.Full || res.NetlinkElements != 0 {
		t.Fatalf("full sync that changes rules: %+v, %v; want it all through nft", res, err)
	}
	checkKernelTable(t, nft, rs, nil)
	if s.structure != before {
		t.Errorf("the Syncer does not remember the structure it applied")
	}

	// A new Syncer adopting a table that lacks a chain it wants writes it all
	// through nft.
	st2 := clone(st)
	setEndpoints(st2, name, 7, 29)
	s2 := New(nft, WithNetlink(KernelNetlink(ns.Do)))
	if res, err := s2.Sync(ctx, ruleset.Build(st2, testConfig, knftables.IPv4Family)); err != nil || res.NetlinkElements != 0 {
		t.Fatalf("adopting a table without dnat-29: %+v, %v; want it all through nft", res, err)
	}
	checkKernelTable(t, nft, ruleset.Build(st2, testConfig, knftables.IPv4Family), nil)
	// One adopting a table with every object it wants, and more (dnat-29, which it
	// deletes, as svc-7 goes down to 2 endpoints, a count in use), writes the
	// elements over netlink.
	st3 := clone(st2)
	setEndpoints(st3, name, 7, 2)
	rs3 := ruleset.Build(st3, testConfig, knftables.IPv4Family)
	s3 := New(nft, WithNetlink(KernelNetlink(ns.Do)))
	if res, err := s3.Sync(ctx, rs3); err != nil || res.NetlinkElements == 0 || !res.Deleted {
		t.Fatalf("adopting the table: %+v, %v; want elements over netlink, dnat-29 deleted", res, err)
	}
	checkKernelTable(t, nft, rs3, nil)
	// Its next full sync, of the same rules, goes over netlink.
	s3.RequestFullSync()
	if res, err := s3.Sync(ctx, ruleset.Build(st3, testConfig, knftables.IPv4Family)); err != nil || res.NetlinkElements == 0 {
		t.Fatalf("second full sync of the new Syncer: %+v, %v; want elements over netlink", res, err)
	}
	checkKernelTable(t, nft, rs3, nil)
}

// TestKernelNetlinkFallback makes the netlink load fail: the full sync writes the
// whole table through nft instead, says why, and later full syncs use nft only.
func TestKernelNetlinkFallback(t *testing.T) {
	ctx := context.Background()
	rs := ruleset.Build(cluster(30), testConfig, knftables.IPv4Family)
	_, nft, s := netlinkSyncer(t, "nlfb", knftables.IPv4Family)
	broken := errors.New("netlink refused")
	s.transport = brokenTransport{broken}
	res, err := s.Sync(ctx, rs)
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(res.Fallback, broken) || res.NetlinkElements != 0 {
		t.Errorf("Result %+v; want the netlink error as Fallback and no element over netlink", res)
	}
	checkKernelTable(t, nft, rs, nil)
	s.RequestFullSync()
	if res, err := s.Sync(ctx, rs); err != nil || res.Fallback != nil || res.NetlinkElements != 0 {
		t.Errorf("next full sync: %+v, %v; want nft only", res, err)
	}
}

// TestKernelNetlinkError checks the kernel's refusal of a batch: the error names
// the set and the errno, and nothing of the batch is applied.
func TestKernelNetlinkError(t *testing.T) {
	ctx := context.Background()
	rs := ruleset.Build(cluster(10), testConfig, knftables.IPv4Family)
	ns, nft, s := netlinkSyncer(t, "nlerr", knftables.IPv4Family)
	if _, err := s.Sync(ctx, rs); err != nil {
		t.Fatal(err)
	}
	conts := netlinkContainers(rs)
	ghost := &container{name: "no-such-set", key: conts[0].key}
	rs2 := ruleset.Build(cluster(20), testConfig, knftables.IPv4Family)
	rs2.Elements[ghost.name] = map[string]ruleset.Elem{"10.0.0.1": {}}
	ghost.key, _ = nftdata.ParseLayout("ipv4_addr")
	err := writeElements(ctx, rs2, fullOps(rs2, append(conts, ghost)), KernelNetlink(ns.Do), nil)
	if !errors.Is(err, syscall.ENOENT) || !strings.Contains(err.Error(), "no-such-set") {
		t.Fatalf("error %v; want ENOENT naming no-such-set", err)
	}
	// The batch was aborted: the table still holds rs.
	checkKernelTable(t, nft, rs, nil)
}

// TestKernelNetlinkIncremental checks incremental syncs with netlink on: those
// whose operations are element operations only go as one netlink batch (deleting
// changed elements and adding their new versions, or emptying a kept set), the
// others through nft, and after each the kernel's table holds the desired ruleset
// (and the objects kept).
func TestKernelNetlinkIncremental(t *testing.T) {
	ctx := context.Background()
	st := cluster(40)
	b := changeset.NewBuilder(testConfig, knftables.IPv4Family)
	_, nft, s := netlinkSyncer(t, "nlinc", knftables.IPv4Family)
	rs, d := b.Update(st, nil)
	if _, err := s.Apply(ctx, rs, d); err != nil {
		t.Fatal(err)
	}
	name := state.ServiceName{Namespace: "ns", Name: "svc-5"}
	for step, tc := range []struct {
		endpoints int
		netlink   bool
		why       string
	}{
		{3, true, "other endpoint addresses of a count in use: elements only"},
		{3, true, "other endpoint addresses again"},
		{17, false, "a count not in use: new chains, sets and maps"},
		{3, true, "back to a count in use: the dnat-17 objects are kept, emptied element by element"},
		{17, true, "17 again: the kept objects are taken back, elements only"},
		{0, false, "no endpoints: a rule in a dispatch chain for a class not in use yet"},
	} {
		st = clone(st)
		setEndpoints(st, name, 100+step, tc.endpoints)
		rs, d = b.Update(st, map[state.ServiceName]bool{name: true})
		res, err := s.Apply(ctx, rs, d)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		if res.Full || res.Fallback != nil || res.Operations == 0 {
			t.Fatalf("step %d: %+v; want an incremental sync without fallback", step, res)
		}
		if got := res.NetlinkElements > 0; got != tc.netlink {
			t.Errorf("step %d (%s): %d of %d operations over netlink; want netlink %v", step, tc.why, res.NetlinkElements, res.Operations, tc.netlink)
		}
		if tc.netlink && res.NetlinkElements > res.Operations {
			t.Errorf("step %d: %d elements over netlink of %d operations", step, res.NetlinkElements, res.Operations)
		}
		checkKeptTable(t, nft, rs, s.keep)
	}

	// A failed batch: the operations go through nft, and netlink is off afterwards.
	broken := errors.New("netlink refused")
	s.transport = brokenTransport{broken}
	st = clone(st)
	setEndpoints(st, name, 200, 0)
	rs, d = b.Update(st, map[state.ServiceName]bool{name: true})
	st = clone(st)
	setEndpoints(st, name, 201, 3)
	rs, d = b.Update(st, map[state.ServiceName]bool{name: true})
	res, err := s.Apply(ctx, rs, d)
	if err != nil || !errors.Is(res.Fallback, broken) || res.NetlinkElements != 0 || res.Operations == 0 {
		t.Fatalf("sync with a failing batch: %+v, %v; want the operations through nft and the netlink error as Fallback", res, err)
	}
	checkKeptTable(t, nft, rs, s.keep)
	if s.Netlink() {
		t.Error("netlink still on after a failed batch")
	}
}

// checkKeptTable checks that the kernel's table holds rs and the objects k keeps,
// the kept sets and maps empty.
func checkKeptTable(t *testing.T, nft knftables.Interface, rs *ruleset.Ruleset, k *keeper) {
	t.Helper()
	checkKernelNames(t, nft, map[string][]string{
		"chain": slices.Concat(ruleset.SortedKeys(rs.Chains), ruleset.SortedKeys(k.chains)),
		"set":   slices.Concat(ruleset.SortedKeys(rs.Sets), ruleset.SortedKeys(k.sets)),
		"map":   slices.Concat(ruleset.SortedKeys(rs.Maps), ruleset.SortedKeys(k.maps)),
	})
	kept := ruleset.New(rs.Family, rs.Table)
	maps.Copy(kept.Sets, k.sets)
	maps.Copy(kept.Maps, k.maps)
	checkKernelElements(t, nft, rs, nil)
	checkKernelElements(t, nft, kept, nil)
}

// brokenTransport is a Transport whose every batch fails with err.
type brokenTransport struct{ err error }

func (t brokenTransport) send(context.Context, *frame, uint32, definitions) error { return t.err }

// TestPlanElementBatch checks which planned operations can go as a netlink
// batch: element additions and deletions and set flushes, in an order the batch
// keeps (per set: flush, deletions, additions), of sets the loader encodes.
func TestPlanElementBatch(t *testing.T) {
	rs := ruleset.New(knftables.IPv4Family, testConfig.Table)
	rs.AddSet(&knftables.Set{Name: "ips", Type: "ipv4_addr"})
	rs.AddSet(&knftables.Set{Name: "ranges", Type: "ipv4_addr", Flags: []knftables.SetFlag{knftables.IntervalFlag}})
	gone := &knftables.Set{Name: "kept", Type: "ipv4_addr . inet_service"}
	delta := changeset.NewDelta()
	delta.Sets["kept"] = changeset.Change[*knftables.Set]{Old: gone}
	el := func(set string, key ...string) *knftables.Element { return &knftables.Element{Set: set, Key: key} }
	for _, tc := range []struct {
		name  string
		ops   func(r *Plan)
		ok    bool
		elems int
	}{
		{"deletions then additions", func(r *Plan) {
			r.Delete(el("ips", "10.0.0.1"))
			r.Add(el("ips", "10.0.0.2"))
			r.Delete(el("kept", "10.0.0.3", "80"))
		}, true, 3},
		{"a flush first", func(r *Plan) {
			r.Flush(&knftables.Set{Name: "ips"})
			r.Add(el("ips", "10.0.0.2"))
		}, true, 1},
		{"a deletion after an addition", func(r *Plan) {
			r.Add(el("ips", "10.0.0.2"))
			r.Delete(el("ips", "10.0.0.1"))
		}, false, 0},
		{"a flush after an addition", func(r *Plan) {
			r.Add(el("ips", "10.0.0.2"))
			r.Flush(&knftables.Set{Name: "ips"})
		}, false, 0},
		{"a chain", func(r *Plan) {
			r.Add(el("ips", "10.0.0.2"))
			r.Add(&knftables.Chain{Name: "c"})
		}, false, 0},
		{"a new set", func(r *Plan) { r.Add(&knftables.Set{Name: "ips"}) }, false, 0},
		{"an interval set", func(r *Plan) { r.Add(el("ranges", "10.0.0.0/8")) }, false, 0},
		{"an unknown set", func(r *Plan) { r.Add(el("nowhere", "10.0.0.1")) }, false, 0},
	} {
		r := &Plan{}
		tc.ops(r)
		ops, n, ok := r.elementBatch(rs, delta)
		if ok != tc.ok || n != tc.elems {
			t.Errorf("%s: ok %v, %d elements; want %v, %d", tc.name, ok, n, tc.ok, tc.elems)
		}
		if ok {
			tx := knftables.NewFake(rs.Family, rs.Table).NewTransaction()
			r.queue(tx)
			if tx.NumOperations() != len(r.Ops) {
				t.Errorf("%s: queue queued %d operations of %d", tc.name, tx.NumOperations(), len(r.Ops))
			}
			if len(ops) == 0 {
				t.Errorf("%s: no operations", tc.name)
			}
		}
	}
}

// TestFrameFailure checks the error made of the kernel's answer: the set of the
// failed message, the errno, and the extended-ack text, whose attribute need not
// be padded at the end of the answer.
func TestFrameFailure(t *testing.T) {
	f := &frame{names: []string{"", "hairpin", ""}}
	code := -int32(syscall.ENOENT)
	data := binary.NativeEndian.AppendUint32(nil, uint32(code))
	hdr := make([]byte, 16) // the failed message's header
	binary.NativeEndian.PutUint32(hdr[8:], 2)
	data = append(data, hdr...)
	msg := "No such set"
	data = binary.NativeEndian.AppendUint16(data, uint16(4+len(msg)))
	data = binary.NativeEndian.AppendUint16(data, unix.NLMSGERR_ATTR_MSG)
	data = append(data, msg...) // 15 bytes: not padded
	m := syscall.NetlinkMessage{Header: syscall.NlMsghdr{Type: unix.NLMSG_ERROR, Flags: unix.NLM_F_ACK_TLVS}, Data: data}
	err := f.failure(m, syscall.ENOENT)
	if !errors.Is(err, syscall.ENOENT) || err.Error() != "hairpin: no such file or directory (No such set)" {
		t.Errorf("failure = %v", err)
	}
	// An attribute of another type, unpadded at the end: no text.
	m.Data = append(binary.NativeEndian.AppendUint16(data[:20:20], 5), 99, 0, 1)
	if err := f.failure(m, syscall.ENOENT); err.Error() != "hairpin: no such file or directory" {
		t.Errorf("failure without a message attribute = %v", err)
	}
}

// TestEncodeOpsBufferSize checks that encodeOps sizes its buffer to the elements
// it writes: a large batch of uncommented elements fits without the buffer
// growing, and leaves under 1% of it unused.
func TestEncodeOpsBufferSize(t *testing.T) {
	for _, def := range []struct {
		set *knftables.Set
		m   *knftables.Map
		el  func(i int) *knftables.Element
	}{
		{set: &knftables.Set{Name: "hairpin-with-a-long-set-name", Type: "ipv4_addr . ipv4_addr"}, el: func(i int) *knftables.Element {
			a := fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)
			return &knftables.Element{Key: []string{a, a}}
		}},
		{m: &knftables.Map{Name: "backends-0", Type: "ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service"}, el: func(i int) *knftables.Element {
			return &knftables.Element{Key: []string{fmt.Sprintf("172.30.%d.%d", i>>8&255, i&255), "tcp", "80"}, Value: []string{"10.1.0.1", "8080"}}
		}},
	} {
		c, err := containerOf(def.set, def.m)
		if err != nil {
			t.Fatal(err)
		}
		const n = 200000
		add := func(yield func(*knftables.Element) bool) {
			for i := range n {
				if !yield(def.el(i)) {
					return
				}
			}
		}
		w, err := encodeOps(unix.NFPROTO_IPV4, "a-table-name", &elementOps{c: c, flush: true, add: add, n: n})
		if err != nil {
			t.Fatal(err)
		}
		size := n * c.elementLen()
		if want := size + size>>9 + 1<<10; cap(w.b) != want {
			t.Errorf("%s: buffer grew to %d bytes from %d", c.name, cap(w.b), want)
		}
		if spare := cap(w.b) - len(w.b); spare*100 > cap(w.b) {
			t.Errorf("%s: %d of %d bytes unused", c.name, spare, cap(w.b))
		}
	}
}
