package ruleset

import (
	"fmt"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/state"
)

// scaleCluster returns n Services with 5 endpoints each, in the mix of tools/bench:
// 70% ClusterIP, 20% NodePort, 10% LoadBalancer, about 5% externalTrafficPolicy
// Local, 2% sessionAffinity ClientIP and 1% loadBalancerSourceRanges, one in twenty
// UDP. Endpoints are spread over 50 nodes, this node among them.
func scaleCluster(n int) *state.ClusterState {
	const perService = 5
	st := state.NewClusterState()
	st.Node = state.Node{Name: "node-0", Addresses: []netip.Addr{netip.MustParseAddr("192.168.10.1")}}
	nth := func(base [4]byte, k int) netip.Addr {
		v := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
		v += uint32(k)
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	}
	nodePorts := 0
	for i := range n {
		typ := state.TypeClusterIP
		switch r := i % 10; {
		case r >= 9:
			typ = state.TypeLoadBalancer
		case r >= 7:
			typ = state.TypeNodePort
		}
		etpLocal := typ != state.TypeClusterIP && (i/10)%6 == 0
		proto := state.TCP
		if i%20 == 7 {
			proto = state.UDP
		}
		name := state.ServiceName{Namespace: fmt.Sprintf("bench-%03d", i/100), Name: fmt.Sprintf("svc-%06d", i)}
		svc := &state.Service{
			Name:                name,
			Type:                typ,
			ClusterIPs:          []netip.Addr{nth([4]byte{172, 16, 0, 1}, i)},
			ExternalPolicyLocal: etpLocal,
			Ports:               []state.ServicePort{{Name: "http", Protocol: proto, Port: 80}},
		}
		if typ != state.TypeClusterIP {
			svc.Ports[0].NodePort = uint16(30000 + nodePorts)
			nodePorts++
		}
		if typ == state.TypeLoadBalancer {
			svc.LoadBalancerIPs = []netip.Addr{nth([4]byte{100, 64, 0, 1}, i)}
			if (i/10)%10 == 3 {
				svc.SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
			}
		}
		if i%50 == 25 {
			svc.AffinityTimeout = state.DefaultAffinityTimeout
		}
		eps := make([]state.SliceEndpoint, perService)
		for j := range eps {
			eps[j] = state.SliceEndpoint{
				Address: nth([4]byte{10, 1, 0, 1}, i*perService+j), Ready: true, Serving: true,
				NodeName: fmt.Sprintf("node-%d", (i+j)%50),
			}
		}
		if etpLocal && (i/60)%2 == 0 {
			eps[0].NodeName = "node-0"
		}
		st.Services[name] = svc
		sl := &state.EndpointSlice{
			Name: name.Name + "-abcde", Service: name,
			Ports:     []state.EndpointPort{{Name: "http", Protocol: proto, Port: 8080}},
			Endpoints: eps,
		}
		st.Slices[name] = map[string]*state.EndpointSlice{sl.Name: sl}
	}
	return st
}

func scaleConfig() Config {
	cfg := Config{
		LocalMode:    LocalClusterCIDR,
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("172.16.0.0/12")},
	}
	cfg.Defaults()
	return cfg
}

var benchSizes = []int{1000, 10000, 50000}

// cpuTime returns the CPU time (user and system, every thread) the process used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the process CPU time per op since start as cpu-ns/op, which
// other load on the machine disturbs less than the wall time of ns/op.
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
}

// BenchmarkBuildScale measures a from-scratch Build of the ip table at growing
// cluster sizes, 5 endpoints a Service.
func BenchmarkBuildScale(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			st, cfg := scaleCluster(n), scaleConfig()
			b.ReportAllocs()
			start := cpuTime()
			for b.Loop() {
				Build(st, cfg, knftables.IPv4Family)
			}
			reportCPU(b, start)
		})
	}
}

// BenchmarkBuilderFirstUpdate measures the first Builder.Update (every Service,
// with its Delta), as the proxier's first sync does it.
func BenchmarkBuilderFirstUpdate(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			st, cfg := scaleCluster(n), scaleConfig()
			b.ReportAllocs()
			start := cpuTime()
			for b.Loop() {
				NewBuilder(cfg, knftables.IPv4Family).Update(st, nil)
			}
			reportCPU(b, start)
		})
	}
}

// BenchmarkBuilderOneChange measures a Builder.Update of one changed Service.
func BenchmarkBuilderOneChange(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			st, cfg := scaleCluster(n), scaleConfig()
			bld := NewBuilder(cfg, knftables.IPv4Family)
			bld.Update(st, nil)
			name := state.ServiceName{Namespace: "bench-000", Name: "svc-000010"}
			var sl *state.EndpointSlice
			for _, s := range st.Slices[name] {
				sl = s
			}
			full := sl.Endpoints
			b.ReportAllocs()
			i := 0
			start := cpuTime()
			for b.Loop() {
				c := *sl
				c.Endpoints = full[:4+i%2]
				st.Slices[name] = map[string]*state.EndpointSlice{c.Name: &c}
				bld.Update(st, map[state.ServiceName]bool{name: true})
				i++
			}
			reportCPU(b, start)
		})
	}
}

// BenchmarkAddTo measures queuing a whole ruleset on a transaction, as a full sync
// does.
func BenchmarkAddTo(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			rs := Build(scaleCluster(n), scaleConfig(), knftables.IPv4Family)
			f := knftables.NewFake(knftables.IPv4Family, rs.Table)
			b.ReportAllocs()
			start := cpuTime()
			for b.Loop() {
				rs.AddTo(f.NewTransaction())
			}
			reportCPU(b, start)
		})
	}
}

// BenchmarkBuildServiceOnly measures buildService alone over every Service, its
// fragments thrown away: the floor of a first build, whatever the merging.
func BenchmarkBuildServiceOnly(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			st, cfg := scaleCluster(n), scaleConfig()
			b.ReportAllocs()
			for b.Loop() {
				for _, svc := range st.Services {
					buildService(cfg, knftables.IPv4Family, st, svc, func([]string, string, int) bool { return true })
				}
			}
		})
	}
}
