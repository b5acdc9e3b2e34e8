package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nftproxy/nftproxy/e2e/lab"
)

// TestDualStackServices runs a dual-stack lab and reaches a SingleStack IPv6, a
// PreferDualStack and a RequireDualStack (IPv6 first) NodePort Service for real over
// every family each has: their ClusterIPs from a pod behind an nftproxy node and one
// behind a kube-proxy node, and their node ports from the external namespace at both
// nodes' addresses of the family. Every connection must be answered, by each of the
// three endpoints (one per node) in turn, and a pod client must be seen with its own
// address of the family.
func TestDualStackServices(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := startCluster(t, ctx, Spec{DualStack: true, Nodes: []NodeSpec{
		{Name: "node-a", Proxy: NftProxy},
		{Name: "node-b", Proxy: KubeProxyNftables},
		{Name: "node-c", Proxy: NoProxy},
	}})
	for _, n := range c.Nodes {
		t.Logf("%s: %s %s, pod CIDRs %s %s", n.Spec.Name, n.Addr, n.Addr6, n.PodCIDR, n.PodCIDR6)
	}
	web := map[string]string{"app": "web"}
	pods := addPods(t, ctx, c,
		PodSpec{Name: "web-a", Node: "node-a", Labels: web, Ports: []uint16{8080}},
		PodSpec{Name: "web-b", Node: "node-b", Labels: web, Ports: []uint16{8080}},
		PodSpec{Name: "web-c", Node: "node-c", Labels: web, Ports: []uint16{8080}},
		PodSpec{Name: "client-a", Node: "node-a"},
		PodSpec{Name: "client-b", Node: "node-b"},
	)
	single, prefer, require := v1.IPFamilyPolicySingleStack, v1.IPFamilyPolicyPreferDualStack, v1.IPFamilyPolicyRequireDualStack
	services := []struct {
		name     string
		policy   *v1.IPFamilyPolicy
		families []v1.IPFamily
		want     int // ClusterIPs
	}{
		{"v6-single", &single, []v1.IPFamily{v1.IPv6Protocol}, 1},
		{"prefer-dual", &prefer, nil, 2},
		{"require-dual", &require, []v1.IPFamily{v1.IPv6Protocol, v1.IPv4Protocol}, 2},
	}
	for _, s := range services {
		svc := createDualService(t, ctx, c, s.name, s.policy, s.families, web)
		if len(svc.Spec.ClusterIPs) != s.want {
			t.Errorf("service %s: ClusterIPs %v, want %d", s.name, svc.Spec.ClusterIPs, s.want)
		}
		waitEndpoints(t, ctx, c, s.name, map[string]string{"web-a": "RS-", "web-b": "RS-", "web-c": "RS-"})
		nodePort := uint16(svc.Spec.Ports[0].NodePort)
		for _, ip := range svc.Spec.ClusterIPs {
			a := netip.MustParseAddr(ip)
			for _, client := range []*Pod{pods["client-a"], pods["client-b"]} {
				own := client.Addr
				if a.Is6() {
					own = client.Addr6
				}
				reachAll(t, ctx, client.NS, fmt.Sprintf("%s from %s", s.name, client.Spec.Name), netip.AddrPortFrom(a, 80), own)
			}
			for _, n := range c.Nodes[:2] {
				reachAll(t, ctx, c.External, fmt.Sprintf("%s node port of %s", s.name, n.Spec.Name),
					netip.AddrPortFrom(nodeAddr(n, a), nodePort), netip.Addr{})
			}
		}
	}
}

// createDualService creates a NodePort Service of one TCP port (80 to 8080) with the IP
// family policy and families given and returns it as created.
func createDualService(t *testing.T, ctx context.Context, c *Cluster, name string, policy *v1.IPFamilyPolicy,
	families []v1.IPFamily, selector map[string]string) *v1.Service {
	t.Helper()
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: v1.ServiceSpec{
			Type:           v1.ServiceTypeNodePort,
			IPFamilyPolicy: policy,
			IPFamilies:     families,
			Selector:       selector,
			Ports:          []v1.ServicePort{{Name: "echo", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: v1.ProtocolTCP}},
		},
	}
	var created *v1.Service
	err := waitFor(ctx, defaultWait, "create service default/"+name, func() (bool, error) {
		var err error
		created, err = c.Client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
		return err == nil, err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("service %s: ClusterIPs %v, families %v, node port %d", name, created.Spec.ClusterIPs,
		created.Spec.IPFamilies, created.Spec.Ports[0].NodePort)
	return created
}

// dualEndpoints are the pods TestDualStackServices' Services select.
var dualEndpoints = []string{"web-a", "web-b", "web-c"}

// reachAll connects from ns to dst until every endpoint has answered: once a first
// answer says the proxy has programmed the Service, every connection must be answered
// by an endpoint, within 100 connections all of them must have, and when own is set
// each must have seen it as the source.
func reachAll(t *testing.T, ctx context.Context, ns *lab.NS, what string, dst netip.AddrPort, own netip.Addr) {
	t.Helper()
	err := waitFor(ctx, defaultWait, what+": first answer", func() (bool, error) {
		_, err := ns.Echo(lab.Request{Proto: lab.TCP, Dst: dst, Timeout: time.Second})
		return err == nil, nil
	})
	if err != nil {
		t.Errorf("%s (%s): %v", what, dst, err)
		return
	}
	got := tally{reached: map[string]int{}, failures: map[lab.Outcome]int{}, sources: map[netip.Addr]int{}}
	for i := 0; i < 100 && len(got.reached) < len(dualEndpoints); i++ {
		r, err := ns.Echo(lab.Request{Proto: lab.TCP, Dst: dst, Timeout: 2 * time.Second})
		if err != nil {
			got.failures[lab.Classify(err)]++
			continue
		}
		got.reached[r.Pod]++
		got.sources[r.Source.Addr()]++
	}
	for pod := range got.reached {
		if !slices.Contains(dualEndpoints, pod) {
			t.Errorf("%s (%s): answered by %s, not an endpoint", what, dst, pod)
		}
	}
	t.Logf("%s (%s): %v, sources %v", what, dst, got, got.sources)
	badSource := own.IsValid() && got.sources[own] != sum(got.reached)
	if len(got.failures) > 0 || len(got.reached) < len(dualEndpoints) || badSource {
		t.Errorf("%s (%s): %v, sources %v; want every connection answered, by each of %v, seeing %v",
			what, dst, got, got.sources, dualEndpoints, own)
	}
}

// sum adds the counts of m.
func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
