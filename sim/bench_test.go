package sim

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/packet"
)

// layoutDump generates, as knftables.Fake.Dump prints it, our ruleset layout
// (docs/ruleset-layout.md) for n ClusterIP Services on tcp/80 with 1 to 3 endpoints
// each: the base and shared chains, dnat-1..3, and per Service a cluster-ips,
// service-ips and hairpin element plus one backends element per endpoint.
func layoutDump(n int) string {
	var b strings.Builder
	b.Grow(n * 400)
	const tab = "ip nftproxy"
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	w("add table %s { comment \"rules for nftproxy\" ; }", tab)
	chains := []string{
		"cluster-ips-check", "dnat-1", "dnat-2", "dnat-3",
		"filter-forward { type filter hook forward priority -110 ; }",
		"filter-input { type filter hook input priority -110 ; }",
		"filter-output { type filter hook output priority -110 ; }",
		"filter-output-post-dnat { type filter hook output priority -90 ; }",
		"filter-prerouting { type filter hook prerouting priority -110 ; }",
		"firewall-check", "mark-for-masquerade", "masquerading",
		"nat-output { type nat hook output priority -100 ; }",
		"nat-postrouting { type nat hook postrouting priority 100 ; }",
		"nat-prerouting { type nat hook prerouting priority -100 ; }",
		"nodeport-endpoints-check", "reject-chain", "service-endpoints-check", "services",
	}
	for _, c := range chains {
		w("add chain %s %s", tab, c)
	}
	w("add set %s cluster-ips { type ipv4_addr ; }", tab)
	w("add set %s external-masq { type ipv4_addr . inet_proto . inet_service ; }", tab)
	w("add set %s hairpin { type ipv4_addr . ipv4_addr ; }", tab)
	w("add set %s nodeport-ips { type ipv4_addr ; }", tab)
	w("add set %s nodeport-masq { type inet_proto . inet_service ; }", tab)
	w("add map %s backends { typeof ip daddr . meta l4proto . th dport . numgen random mod 1 : ip daddr . th dport ; }", tab)
	w("add map %s firewall-ips { type ipv4_addr . inet_proto . inet_service : verdict ; }", tab)
	w("add map %s no-endpoint-nodeports { type inet_proto . inet_service : verdict ; }", tab)
	w("add map %s no-endpoint-services { type ipv4_addr . inet_proto . inet_service : verdict ; }", tab)
	w("add map %s service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; }", tab)
	w("add map %s service-nodeports { type inet_proto . inet_service : verdict ; }", tab)
	rules := [][2]string{
		{"cluster-ips-check", "ip daddr @cluster-ips reject"},
		{"cluster-ips-check", "ip daddr 172.30.0.0/16 drop"},
		{"dnat-1", "meta l4proto { tcp, udp, sctp } dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 1 map @backends"},
		{"dnat-2", "meta l4proto { tcp, udp, sctp } dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 2 map @backends"},
		{"dnat-3", "meta l4proto { tcp, udp, sctp } dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 3 map @backends"},
		{"filter-forward", "ct state new jump service-endpoints-check"},
		{"filter-forward", "ct state new jump cluster-ips-check"},
		{"filter-input", "ct state new jump nodeport-endpoints-check"},
		{"filter-input", "ct state new jump service-endpoints-check"},
		{"filter-output", "ct state new jump service-endpoints-check"},
		{"filter-output", "ct state new jump firewall-check"},
		{"filter-output-post-dnat", "ct state new jump cluster-ips-check"},
		{"filter-prerouting", "ct state new jump firewall-check"},
		{"firewall-check", "ip daddr . meta l4proto . th dport vmap @firewall-ips"},
		{"mark-for-masquerade", "mark set mark or 0x4000"},
		{"masquerading", "ct status dnat ip saddr . ip daddr @hairpin jump mark-for-masquerade"},
		{"masquerading", "mark and 0x4000 == 0 return"},
		{"masquerading", "mark set mark xor 0x4000"},
		{"masquerading", "masquerade fully-random"},
		{"nat-output", "jump services"},
		{"nat-postrouting", "jump masquerading"},
		{"nat-prerouting", "jump services"},
		{"nodeport-endpoints-check", "ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports"},
		{"reject-chain", "reject"},
		{"service-endpoints-check", "ip daddr . meta l4proto . th dport vmap @no-endpoint-services"},
		{"services", "ip daddr @cluster-ips ip saddr != 10.0.0.0/8 jump mark-for-masquerade"},
		{"services", "ip daddr . meta l4proto . th dport @external-masq jump mark-for-masquerade"},
		{"services", "ip daddr @nodeport-ips meta l4proto . th dport @nodeport-masq jump mark-for-masquerade"},
		{"services", "ip daddr . meta l4proto . th dport vmap @service-ips"},
		{"services", "ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports"},
	}
	for _, r := range rules {
		w("add rule %s %s %s", tab, r[0], r[1])
	}
	vip := func(i int) string { return fmt.Sprintf("172.30.%d.%d", i/256, i%256) }
	ep := func(i, j int) string { return fmt.Sprintf("10.%d.%d.%d", 1+j, i/256, i%256) }
	for i := 0; i < n; i++ {
		w("add element %s cluster-ips { %s }", tab, vip(i))
	}
	for i := 0; i < n; i++ {
		for j := 0; j < 1+i%3; j++ {
			w("add element %s hairpin { %s . %s }", tab, ep(i, j), ep(i, j))
		}
	}
	w("add element %s nodeport-ips { 192.168.0.2 }", tab)
	for i := 0; i < n; i++ {
		for j := 0; j < 1+i%3; j++ {
			w("add element %s backends { %s . tcp . 80 . %d : %s . 8080 }", tab, vip(i), j, ep(i, j))
		}
	}
	for i := 0; i < n; i++ {
		w("add element %s service-ips { %s . tcp . 80 comment \"ns/svc-%d/tcp/http\" : goto dnat-%d }", tab, vip(i), i, 1+i%3)
	}
	return b.String()
}

var benchProgs sync.Map // n -> *Program

func benchProgram(b *testing.B, n int) *Program {
	if p, ok := benchProgs.Load(n); ok {
		return p.(*Program)
	}
	p, err := CompileText(layoutDump(n))
	if err != nil {
		b.Fatal(err)
	}
	benchProgs.Store(n, p)
	return p
}

// BenchmarkTrace measures one trace of a pod's packet to a ClusterIP with two
// endpoints (two branches) in our layout; dispatch is by map lookups, so the time
// must not grow with the number of Services. Both rulesets are compiled before either
// is measured, so that both run with the same live heap (and garbage collector pace).
func BenchmarkTrace(b *testing.B) {
	sizes := []int{1000, 50000}
	for _, n := range sizes {
		benchProgram(b, n)
	}
	for _, n := range sizes {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			p := benchProgram(b, n)
			target := n/2 - (n/2)%3 + 1 // a Service with two endpoints
			pkt := packet.Packet{
				Protocol: packet.TCP,
				Src:      netip.MustParseAddrPort("10.1.0.5:40000"),
				Dst:      netip.AddrPortFrom(netip.AddrFrom4([4]byte{172, 30, byte(target / 256), byte(target % 256)}), 80),
				IIf:      "veth-a",
			}
			env := Env{LocalAddrs: []netip.Addr{netip.MustParseAddr("192.168.0.2")}}
			rt := NewRuntime(p, env)
			tr, err := rt.trace(pkt)
			if err != nil {
				b.Fatal(err)
			}
			if len(tr.Branches) != 2 || tr.Branches[0].Outcome.DNAT != true {
				b.Fatalf("unexpected trace:\n%s", tr)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := rt.trace(pkt); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkTraceRatio traces the 1,000- and the 50,000-Service rulesets alternately,
// timing each trace, and reports the median ns per trace of each and their ratio. On
// a shared machine whose load changes during the run, alternating and taking medians
// keeps the ratio honest where two separate benchmarks would each catch a different
// load, and a mean would follow the outliers.
func BenchmarkTraceRatio(b *testing.B) {
	env := Env{LocalAddrs: []netip.Addr{netip.MustParseAddr("192.168.0.2")}}
	var rts [2]*Runtime
	var pkts [2]packet.Packet
	for i, n := range []int{1000, 50000} {
		rts[i] = NewRuntime(benchProgram(b, n), env)
		target := n/2 - (n/2)%3 + 1
		pkts[i] = packet.Packet{
			Protocol: packet.TCP,
			Src:      netip.MustParseAddrPort("10.1.0.5:40000"),
			Dst:      netip.AddrPortFrom(netip.AddrFrom4([4]byte{172, 30, byte(target / 256), byte(target % 256)}), 80),
			IIf:      "veth-a",
		}
	}
	spent := [2][]time.Duration{make([]time.Duration, 0, b.N), make([]time.Duration, 0, b.N)}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for k := 0; k < 2; k++ {
			j := (i + k) % 2 // alternate which size goes first
			t0 := time.Now()
			if _, err := rts[j].trace(pkts[j]); err != nil {
				b.Fatal(err)
			}
			spent[j] = append(spent[j], time.Since(t0))
		}
	}
	b.StopTimer()
	median := func(d []time.Duration) float64 {
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		return float64(d[len(d)/2].Nanoseconds())
	}
	small, large := median(spent[0]), median(spent[1])
	b.ReportMetric(small, "ns/trace-1k")
	b.ReportMetric(large, "ns/trace-50k")
	b.ReportMetric(large/small, "ratio")
}

// BenchmarkCompile measures compiling the 1,000-Service dump.
func BenchmarkCompile(b *testing.B) {
	src := layoutDump(1000)
	b.SetBytes(int64(len(src)))
	for i := 0; i < b.N; i++ {
		if _, err := CompileText(src); err != nil {
			b.Fatal(err)
		}
	}
}

// TestLayoutDumpIsValid keeps the benchmark honest: the generated dump compiles, and
// its Services resolve to their endpoints.
func TestLayoutDumpIsValid(t *testing.T) {
	p := mustCompile(t, layoutDump(30))
	tr := mustTrace(t, p, "tcp 10.1.0.5:40000 -> 172.30.0.29:80 iif veth-a", testEnv)
	checkOutcomes(t, tr, []want{
		{dst: "10.1.0.29:8080", p: 1.0 / 3, v: A, d: Fw},
		{dst: "10.2.0.29:8080", p: 1.0 / 3, v: A, d: Fw},
		{dst: "10.3.0.29:8080", p: 1.0 / 3, v: A, d: Fw},
	})
}
