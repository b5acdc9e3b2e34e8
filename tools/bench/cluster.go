package main

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
)

// The synthetic cluster's address plan. Every address lives only inside namespaces
// the bench creates.
var (
	clusterCIDR = netip.MustParsePrefix("10.0.0.0/8")
	serviceCIDR = netip.MustParsePrefix("172.16.0.0/12")
	// firstClusterIP, firstLBIP and firstEndpoint start the ranges the i-th Service
	// (and its endpoints) take their addresses from.
	firstClusterIP = netip.MustParseAddr("172.16.0.1")
	firstLBIP      = netip.MustParseAddr("100.64.0.1")
	firstEndpoint  = netip.MustParseAddr("10.1.0.1")
	// sourceRange is the loadBalancerSourceRanges of the Services that have one.
	sourceRange = netip.MustParsePrefix("192.0.2.0/24")
	// nodeAddr is the node's address (eth0 of the data-plane lab's node).
	nodeAddr = netip.MustParsePrefix("192.168.10.1/24")
)

const (
	nodeName = "node-0"
	// nodes is the number of nodes endpoints are spread over; this node is one.
	nodes = 50
	// endpointsPerService is M, the endpoint count of every generated Service.
	endpointsPerService = 5
	servicePort         = 80
	targetPort          = 8080
	firstNodePort       = 30000
	firstHealthCheck    = 50000
)

// The address plan's bounds. One Service in ten is a NodePort and one a
// LoadBalancer, each taking a NodePort from firstNodePort up, which must stay
// below 65536 (past 66,667 Services they overlap the health-check ports, which no
// ruleset holds); the endpoints, with the ones changes add, must stay below the
// data plane's backends (10.200.0.0), ~13M addresses from firstEndpoint.
const (
	maxServices             = 100000
	maxEndpointsPerService  = 100
	maxEndpointsAllServices = 10000000
)

// checkPlan reports whether n Services with m endpoints each fit the address plan.
func checkPlan(n, m int) error {
	switch {
	case n < 1 || n > maxServices:
		return fmt.Errorf("%d Services: want 1 to %d (the address plan's limit)", n, maxServices)
	case m < 1 || m > maxEndpointsPerService:
		return fmt.Errorf("%d endpoints per Service: want 1 to %d", m, maxEndpointsPerService)
	case n*m > maxEndpointsAllServices:
		return fmt.Errorf("%d Services x %d endpoints: at most %d endpoints in all (the address plan's limit)", n, m, maxEndpointsAllServices)
	}
	return nil
}

// mix is the shape of the generated cluster, in Services out of every 100 (types)
// or as a fraction of all Services (the rest). See DESIGN of the Scale issue: 70%
// ClusterIP, 20% NodePort, 10% LoadBalancer, ~5% externalTrafficPolicy Local, ~2%
// sessionAffinity ClientIP, 1% loadBalancerSourceRanges.
//
// The kind of Service i is a function of i alone, so that every N is a prefix of
// the larger ones and the mix holds from N = 100 on.
func kindOf(i int) (typ string, etpLocal, affinity, sourceRanges bool) {
	switch r := i % 10; {
	case r < 7:
		typ = state.TypeClusterIP
	case r < 9:
		typ = state.TypeNodePort
	default:
		typ = state.TypeLoadBalancer
	}
	// One external Service in six (30% of all) is ETP Local: 5% of all.
	etpLocal = typ != state.TypeClusterIP && (i/10)%6 == 0
	affinity = i%50 == 25
	sourceRanges = typ == state.TypeLoadBalancer && (i/10)%10 == 3
	return typ, etpLocal, affinity, sourceRanges
}

// cluster is a synthetic ClusterState and the bookkeeping to change it the way the
// Tracker would: a changed Service's EndpointSlice is replaced, never modified in
// place.
type cluster struct {
	n int
	// m is the endpoint count of every generated Service.
	m     int
	state *state.ClusterState
	names []state.ServiceName // index i -> Service i
	// nextEndpoint numbers endpoints added by changes, past the generated ones.
	nextEndpoint int
	// target is the Service the data plane connects to (nil when not asked for).
	target *state.Service
}

// serviceName returns the name of Service i: 100 Services a namespace.
func serviceName(i int) state.ServiceName {
	return state.ServiceName{Namespace: fmt.Sprintf("bench-%03d", i/100), Name: fmt.Sprintf("svc-%06d", i)}
}

// nthAddr returns the address n after a.
func nthAddr(a netip.Addr, n int) netip.Addr {
	b := a.As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(n)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// protocolOf returns the protocol of Service i: one in twenty is UDP (DNS-like).
func protocolOf(i int) state.Protocol {
	if i%20 == 7 {
		return state.UDP
	}
	return state.TCP
}

// newCluster returns the synthetic cluster of n Services with endpointsPerService
// endpoints each, deterministically.
func newCluster(n int) *cluster { return newClusterM(n, endpointsPerService) }

// newClusterM returns the synthetic cluster of n Services with m endpoints each,
// deterministically (m within checkPlan's bounds).
func newClusterM(n, m int) *cluster {
	c := &cluster{n: n, m: m, state: state.NewClusterState(), nextEndpoint: n * m}
	c.state.Node = state.Node{Name: nodeName, Addresses: []netip.Addr{nodeAddr.Addr()}}
	nodePorts := 0
	for i := range n {
		typ, etpLocal, affinity, ranges := kindOf(i)
		name := serviceName(i)
		svc := &state.Service{
			Name:                name,
			Type:                typ,
			ClusterIPs:          []netip.Addr{nthAddr(firstClusterIP, i)},
			ExternalPolicyLocal: etpLocal,
			Ports:               []state.ServicePort{{Name: "http", Protocol: protocolOf(i), Port: servicePort}},
		}
		if typ != state.TypeClusterIP {
			svc.Ports[0].NodePort = uint16(firstNodePort + nodePorts)
			nodePorts++
		}
		if typ == state.TypeLoadBalancer {
			svc.LoadBalancerIPs = []netip.Addr{nthAddr(firstLBIP, i)}
			if etpLocal {
				svc.HealthCheckNodePort = uint16(firstHealthCheck + i%10000)
			}
		}
		if affinity {
			svc.AffinityTimeout = state.DefaultAffinityTimeout
		}
		if ranges {
			svc.SourceRanges = []netip.Prefix{sourceRange}
		}
		eps := make([]state.SliceEndpoint, m)
		for j := range eps {
			eps[j] = endpoint(nthAddr(firstEndpoint, i*m+j), (i+j)%nodes)
		}
		if etpLocal && (i/60)%2 == 0 {
			eps[0].NodeName = nodeName // half the Local Services have an endpoint here
		}
		c.names = append(c.names, name)
		c.state.Services[name] = svc
		c.setEndpoints(svc, eps)
	}
	return c
}

func endpoint(a netip.Addr, node int) state.SliceEndpoint {
	return state.SliceEndpoint{Address: a, Ready: true, Serving: true, NodeName: fmt.Sprintf("node-%d", node)}
}

// setEndpoints replaces the EndpointSlice of svc, as the Tracker does on an update.
func (c *cluster) setEndpoints(svc *state.Service, eps []state.SliceEndpoint) {
	c.state.Slices[svc.Name] = map[string]*state.EndpointSlice{
		svc.Name.Name + "-abcde": {
			Name:      svc.Name.Name + "-abcde",
			Service:   svc.Name,
			Ports:     []state.EndpointPort{{Name: "http", Protocol: svc.Ports[0].Protocol, Port: targetPort}},
			Endpoints: eps,
		},
	}
}

// endpoints returns the endpoints of Service name.
func (c *cluster) endpoints(name state.ServiceName) []state.SliceEndpoint {
	for _, sl := range c.state.Slices[name] {
		return sl.Endpoints
	}
	return nil
}

// change is one Service change of the benchmark: an endpoint added to or removed
// from one Service.
type change struct {
	Service state.ServiceName
	Added   bool
}

// toggleEndpoint changes Service i: with c.m endpoints it gains one (a new pod),
// with more it loses its last one, so that repeated changes keep the cluster's
// shape.
func (c *cluster) toggleEndpoint(i int) change {
	name := c.names[i]
	svc := c.state.Services[name]
	eps := slices.Clone(c.endpoints(name))
	ch := change{Service: name}
	if len(eps) <= c.m {
		eps = append(eps, endpoint(nthAddr(firstEndpoint, c.nextEndpoint), (i+len(eps))%nodes))
		c.nextEndpoint++
		ch.Added = true
	} else {
		eps = eps[:len(eps)-1]
	}
	c.setEndpoints(svc, eps)
	return ch
}

// randomService picks a Service to change, never the data-plane target.
func (c *cluster) randomService(rng *rand.Rand) int {
	return rng.IntN(c.n)
}

// addTarget adds the Service the data plane connects to: a ClusterIP Service whose
// endpoints are the lab's backend pods. Its name sorts after every generated one
// and the iptables baseline lists it last in KUBE-SERVICES, its worst case.
func (c *cluster) addTarget(vip netip.Addr, backends []netip.Addr) *state.Service {
	name := state.ServiceName{Namespace: "zz-target", Name: "target"}
	svc := &state.Service{
		Name:       name,
		Type:       state.TypeClusterIP,
		ClusterIPs: []netip.Addr{vip},
		Ports:      []state.ServicePort{{Name: "http", Protocol: state.TCP, Port: servicePort}},
	}
	eps := make([]state.SliceEndpoint, len(backends))
	for i, a := range backends {
		eps[i] = endpoint(a, 1+i) // remote pods, as far as the policy goes
	}
	c.state.Services[name] = svc
	c.setEndpoints(svc, eps)
	c.target = svc
	return svc
}

// rulesetConfig is the proxier configuration of the benchmark.
func rulesetConfig() ruleset.Config {
	cfg := ruleset.Config{
		LocalMode:    ruleset.LocalClusterCIDR,
		ClusterCIDRs: []netip.Prefix{clusterCIDR},
		ServiceCIDRs: []netip.Prefix{serviceCIDR},
	}
	cfg.Defaults()
	return cfg
}

// mixOf counts the kinds of Services of st, for the report and the tests.
type mixCount struct {
	Services     int `json:"services"`
	Endpoints    int `json:"endpoints"`
	ClusterIP    int `json:"cluster_ip"`
	NodePort     int `json:"node_port"`
	LoadBalancer int `json:"load_balancer"`
	ETPLocal     int `json:"etp_local"`
	Affinity     int `json:"session_affinity"`
	SourceRanges int `json:"source_ranges"`
	UDP          int `json:"udp"`
}

func countMix(st *state.ClusterState) mixCount {
	var m mixCount
	for name, svc := range st.Services {
		if strings.HasPrefix(name.Namespace, "zz-") {
			continue
		}
		m.Services++
		switch svc.Type {
		case state.TypeClusterIP:
			m.ClusterIP++
		case state.TypeNodePort:
			m.NodePort++
		case state.TypeLoadBalancer:
			m.LoadBalancer++
		}
		if svc.ExternalPolicyLocal {
			m.ETPLocal++
		}
		if svc.AffinityTimeout > 0 {
			m.Affinity++
		}
		if len(svc.SourceRanges) > 0 {
			m.SourceRanges++
		}
		if svc.Ports[0].Protocol == state.UDP {
			m.UDP++
		}
		for _, sl := range st.Slices[name] {
			m.Endpoints += len(sl.Endpoints)
		}
	}
	return m
}

// affinitySeconds is the affinity timeout of st's Services, for the iptables text.
func affinitySeconds(d time.Duration) int { return int((d + time.Second - 1) / time.Second) }
