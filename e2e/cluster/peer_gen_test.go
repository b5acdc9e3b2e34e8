package cluster

import (
	"fmt"
	"math/rand/v2"
	"net/netip"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// A random set of the peer conformance suite: pods and Services drawn from a seed,
// covering every Service type, traffic policy, affinity, source range, endpoint
// condition and topology the proxies tell apart.

// podState is the condition a pod of a random set is put in.
type podState int

const (
	podReady podState = iota
	podNotReady
	podTerminating         // deleted with a grace period, still Ready: serving
	podTerminatingNotReady // deleted, not Ready: neither ready nor serving
)

// peerPod is a pod of a random set.
type peerPod struct {
	name   string
	labels map[string]string
	state  podState
	// declared are its named container ports (named targetPorts resolve through them).
	declared []v1.ContainerPort
}

// peerSet is one random set: twins (each placed on both compared nodes, so that local
// endpoints correspond one to one), others (on the third node) and Services.
type peerSet struct {
	index    int
	twins    []peerPod
	others   []peerPod
	services []*v1.Service
	// ingress are the load-balancer ingresses written to the status of LoadBalancer
	// Services, by name.
	ingress map[string][]v1.LoadBalancerIngress
	// externals counts the external IPs drawn: each Service has its own.
	externals int
	// unallocated is a service-CIDR address no Service of the set has; unallocated6 one
	// of the IPv6 service CIDR in a dual-stack lab.
	unallocated, unallocated6 netip.Addr
	// dual says the set is for a dual-stack lab: its Services have IPv6 and dual-stack
	// ones among them.
	dual bool
}

// groups are the labels Services select pods by; a pod carries any of them.
const groups = 5

// The named container ports pods may declare, and the numbers they may stand for: pods
// of one Service map a name to different numbers, as rolling updates make them do.
var namedPorts = []struct {
	name    string
	proto   v1.Protocol
	numbers []int32
}{
	{"web", v1.ProtocolTCP, []int32{8080, 8081}},
	{"dns", v1.ProtocolUDP, []int32{5353}},
	{"sig", v1.ProtocolSCTP, []int32{7777, 7778}},
}

// genSet draws random set number index from seed. The client pods (a twin and an
// other without labels) come first, so that every node has a source that is no
// endpoint.
func genSet(seed uint64, index int, spec *Spec) *peerSet {
	r := rand.New(rand.NewPCG(seed, uint64(index)))
	s := &peerSet{index: index, ingress: map[string][]v1.LoadBalancerIngress{}, dual: spec.DualStack}
	name := func(kind string, i int) string { return fmt.Sprintf("s%d-%s%d", index, kind, i) }
	s.twins = append(s.twins, peerPod{name: name("client", 0), labels: map[string]string{}})
	s.others = append(s.others, peerPod{name: name("client", 1), labels: map[string]string{}})
	for i := range 4 + r.IntN(3) {
		s.twins = append(s.twins, genPod(r, name("twin", i)))
	}
	for i := range 2 + r.IntN(3) {
		s.others = append(s.others, genPod(r, name("other", i)))
	}
	for i := range 18 + r.IntN(8) {
		s.services = append(s.services, genService(r, s, name("svc", i)))
	}
	// An address of the service CIDR's upper half, which the allocator fills last.
	a := spec.ServiceCIDR.Masked().Addr().As4()
	a[2], a[3] = byte(200+r.IntN(50)), byte(1+r.IntN(250))
	s.unallocated = netip.AddrFrom4(a)
	if s.dual {
		s.unallocated6 = withLast2(spec.ServiceCIDR6.Masked().Addr(), int(a[2]), a[3])
	}
	return s
}

func genPod(r *rand.Rand, name string) peerPod {
	p := peerPod{name: name, labels: map[string]string{}}
	for g := range groups {
		if r.IntN(5) < 2 {
			p.labels[fmt.Sprintf("g%d", g)] = "y"
		}
	}
	switch n := r.IntN(20); {
	case n < 13:
		p.state = podReady
	case n < 16:
		p.state = podNotReady
	case n < 19:
		p.state = podTerminating
	default:
		p.state = podTerminatingNotReady
	}
	for _, np := range namedPorts {
		if r.IntN(4) > 0 {
			num := np.numbers[r.IntN(len(np.numbers))]
			p.declared = append(p.declared, v1.ContainerPort{Name: np.name, ContainerPort: num, Protocol: np.proto})
		}
	}
	return p
}

// pick returns one of choices, each with its weight.
func pick[T any](r *rand.Rand, choices ...weighted[T]) T {
	total := 0
	for _, c := range choices {
		total += c.w
	}
	n := r.IntN(total)
	for _, c := range choices {
		if n < c.w {
			return c.v
		}
		n -= c.w
	}
	panic("unreachable")
}

type weighted[T any] struct {
	w int
	v T
}

func genService(r *rand.Rand, s *peerSet, name string) *v1.Service {
	svc := &v1.Service{}
	svc.Name, svc.Namespace = name, "default"
	spec := &svc.Spec
	spec.Type = pick(r, weighted[v1.ServiceType]{35, v1.ServiceTypeClusterIP},
		weighted[v1.ServiceType]{25, v1.ServiceTypeNodePort}, weighted[v1.ServiceType]{40, v1.ServiceTypeLoadBalancer})
	switch n := r.IntN(20); {
	case n < 17:
		spec.Selector = map[string]string{fmt.Sprintf("g%d", r.IntN(groups)): "y"}
	case n < 19: // selects nobody
		spec.Selector = map[string]string{"nobody": "y"}
	} // else no selector: no slices at all
	spec.Ports = genPorts(r)
	external := spec.Type != v1.ServiceTypeClusterIP
	if external && r.IntN(5) < 2 {
		spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	}
	if r.IntN(4) == 0 {
		spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyLocal)
	}
	if r.IntN(4) == 0 {
		spec.SessionAffinity = v1.ServiceAffinityClientIP
		spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To(int32(10 + r.IntN(10800)))}}
	}
	if r.IntN(10) < 3 {
		spec.TrafficDistribution = ptr.To(pick(r, weighted[string]{1, v1.ServiceTrafficDistributionPreferClose},
			weighted[string]{1, v1.ServiceTrafficDistributionPreferSameZone}, weighted[string]{1, v1.ServiceTrafficDistributionPreferSameNode}))
	}
	if r.IntN(10) == 0 {
		spec.PublishNotReadyAddresses = true
	}
	if s.dual {
		genFamilies(r, svc)
	}
	if r.IntN(4) == 0 {
		for range 1 + r.IntN(2) {
			s.externals++
			spec.ExternalIPs = append(spec.ExternalIPs, s.serviceAddr(r, svc, "198.18", "fd00:198:18", s.externals))
		}
	}
	if spec.Type == v1.ServiceTypeLoadBalancer {
		genLoadBalancer(r, s, svc)
	}
	return svc
}

// genFamilies draws the IP families of a Service of a dual-stack set: half keep the
// default (IPv4, the cluster's first family), the others are IPv6 only, prefer dual
// stack or require it, IPv6 first or not.
func genFamilies(r *rand.Rand, svc *v1.Service) {
	spec := &svc.Spec
	switch n := r.IntN(10); {
	case n < 5:
	case n < 7:
		spec.IPFamilyPolicy = ptr.To(v1.IPFamilyPolicySingleStack)
		spec.IPFamilies = []v1.IPFamily{v1.IPv6Protocol}
	case n < 8:
		spec.IPFamilyPolicy = ptr.To(v1.IPFamilyPolicyPreferDualStack)
	default:
		spec.IPFamilyPolicy = ptr.To(v1.IPFamilyPolicyRequireDualStack)
		if r.IntN(2) == 0 {
			spec.IPFamilies = []v1.IPFamily{v1.IPv6Protocol, v1.IPv4Protocol}
		}
	}
}

// families are the IP families a Service gets: as genFamilies drew them, the
// allocator's order aside.
func families(svc *v1.Service) (v4, v6 bool) {
	switch {
	case svc.Spec.IPFamilyPolicy == nil:
		return true, false
	case *svc.Spec.IPFamilyPolicy == v1.IPFamilyPolicySingleStack:
		return false, true
	}
	return true, true
}

// serviceAddr is the external or load-balancer address number n of the set, of one of
// the Service's families at random: v4 is the prefix of an IPv4 one (A.B.index.n), v6
// of an IPv6 one (P:index::n).
func (s *peerSet) serviceAddr(r *rand.Rand, svc *v1.Service, v4, v6 string, n int) string {
	has4, has6 := families(svc)
	if has6 && (!has4 || r.IntN(2) == 0) {
		return fmt.Sprintf("%s:%d::%d", v6, s.index, n)
	}
	return fmt.Sprintf("%s.%d.%d", v4, s.index, n)
}

// genPorts draws one to three ports of distinct names and (port, protocol) pairs.
func genPorts(r *rand.Rand) []v1.ServicePort {
	var out []v1.ServicePort
	used := map[string]bool{}
	for i := range 1 + r.IntN(3) {
		proto := pick(r, weighted[v1.Protocol]{6, v1.ProtocolTCP}, weighted[v1.Protocol]{3, v1.ProtocolUDP},
			weighted[v1.Protocol]{1, v1.ProtocolSCTP})
		port := pick(r, weighted[int32]{3, 80}, weighted[int32]{2, 443}, weighted[int32]{2, 53},
			weighted[int32]{3, int32(9000 + r.IntN(50))})
		key := fmt.Sprint(port, proto)
		if used[key] {
			continue
		}
		used[key] = true
		sp := v1.ServicePort{Name: fmt.Sprintf("p%d", i), Port: port, Protocol: proto,
			TargetPort: intstr.FromInt32(int32(8000 + r.IntN(100)))}
		if r.IntN(3) == 0 {
			for _, np := range namedPorts {
				if np.proto == proto {
					sp.TargetPort = intstr.FromString(np.name)
				}
			}
		}
		out = append(out, sp)
	}
	return out
}

// genLoadBalancer draws the source ranges, node-port allocation and status ingresses
// of a LoadBalancer Service: one or two IPs, some in ipMode Proxy (which kube-proxy
// leaves to the load balancer).
func genLoadBalancer(r *rand.Rand, s *peerSet, svc *v1.Service) {
	spec := &svc.Spec
	if r.IntN(5) < 2 {
		spec.LoadBalancerSourceRanges = pick(r, weighted[[]string]{1, []string{"203.0.113.0/24"}},
			weighted[[]string]{1, []string{"203.0.113.0/25", "192.168.80.0/24"}})
		// IPv6 ranges beside them, or none: ranges of one family only on a Service with
		// IPv6 addresses are a documented difference.
		if _, has6 := families(svc); has6 && r.IntN(3) > 0 {
			spec.LoadBalancerSourceRanges = append(spec.LoadBalancerSourceRanges, "2001:db8:7::/64", "fd00:192:168:80::/64")
		}
	}
	if r.IntN(5) == 0 {
		spec.AllocateLoadBalancerNodePorts = ptr.To(false)
	}
	for i := range 1 + r.IntN(2) {
		ing := v1.LoadBalancerIngress{IP: s.serviceAddr(r, svc, "100.64", "fd00:100:64", len(s.ingress)*4+i+1)}
		if r.IntN(7) == 0 {
			ing.IPMode = ptr.To(v1.LoadBalancerIPModeProxy)
		} else if r.IntN(2) == 0 {
			ing.IPMode = ptr.To(v1.LoadBalancerIPModeVIP)
		}
		s.ingress[svc.Name] = append(s.ingress[svc.Name], ing)
	}
}
