package cluster

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// The differences between nftproxy and kube-proxy that docs/kube-proxy-differences.md
// explains, each told apart by the probe and both outcome classes. A difference no entry
// explains fails the suite.

// explanation is a difference the document explains: doc is its heading there.
type explanation struct {
	doc     string
	applies func(pr probe, nftproxy, kubeProxy string) bool
}

var explanations = []explanation{
	{"Hairpin connections to an endpoint on another node", remoteHairpin},
	{"Source ranges of the other family only", rangesOfOtherFamily},
}

// explain returns the heading of the document that explains the difference, or "".
func explain(pr probe, nftproxy, kubeProxy string) string {
	for _, e := range explanations {
		if e.applies(pr, nftproxy, kubeProxy) {
			return e.doc
		}
	}
	return ""
}

// branches splits an outcome class into its branches.
func branches(class string) []string { return strings.Split(class, " | ") }

// remoteHairpin: a pod on another node whose packet this node sends back to the pod
// itself; nftproxy masquerades it, kube-proxy (nftables mode) does not. Every other
// branch is the same.
func remoteHairpin(pr probe, nftproxy, kubeProxy string) bool {
	if pr.src != srcRemote {
		return false
	}
	self := " to " + pr.srcName + ":"
	var fixed []string
	for _, b := range branches(nftproxy) {
		if strings.Contains(b, self) {
			b = strings.TrimSuffix(b, " masqueraded")
		}
		fixed = append(fixed, b)
	}
	slices.Sort(fixed)
	return strings.Join(fixed, " | ") == kubeProxy
}

// rangesOfOtherFamily: a packet to a load-balancer IP of a Service whose
// loadBalancerSourceRanges hold none of the packet's family; nftproxy drops it,
// kube-proxy lets it through as if the Service had no ranges.
func rangesOfOtherFamily(pr probe, nftproxy, kubeProxy string) bool {
	if pr.svc == nil || pr.dst != dstIngress || len(pr.svc.Spec.LoadBalancerSourceRanges) == 0 || nftproxy != "drop" {
		return false
	}
	for _, r := range pr.svc.Spec.LoadBalancerSourceRanges {
		if p, err := netip.ParsePrefix(r); err == nil && p.Addr().Is6() == pr.six {
			return false
		}
	}
	return kubeProxy != "drop"
}

// TestExplanations checks that each explanation accepts its own difference and nothing
// near it: a masquerade elsewhere, another source, a verdict changed too.
func TestExplanations(t *testing.T) {
	remote := probe{src: srcRemote, srcName: "s0-other3"}
	kp := "accept forward to s0-other3:8080 | accept forward to s0-twin1@here:8080"
	cases := []struct {
		name     string
		pr       probe
		nftproxy string
		want     string
	}{
		{"remote hairpin masqueraded", remote,
			"accept forward to s0-other3:8080 masqueraded | accept forward to s0-twin1@here:8080",
			"Hairpin connections to an endpoint on another node"},
		{"another endpoint masqueraded", remote,
			"accept forward to s0-other3:8080 | accept forward to s0-twin1@here:8080 masqueraded", ""},
		{"the same from a pod on this node", probe{src: srcPod, srcName: "s0-other3"},
			"accept forward to s0-other3:8080 masqueraded | accept forward to s0-twin1@here:8080", ""},
		{"an endpoint missing as well", remote, "accept forward to s0-other3:8080 masqueraded", ""},
		{"a reject instead", remote, "reject", ""},
	}
	for _, tc := range cases {
		if got := explain(tc.pr, tc.nftproxy, kp); got != tc.want {
			t.Errorf("%s: explained by %q, want %q", tc.name, got, tc.want)
		}
	}
	ranged := func(ranges ...string) *v1.Service {
		return &v1.Service{Spec: v1.ServiceSpec{LoadBalancerSourceRanges: ranges}}
	}
	lb := "accept forward to s0-twin1@here:8080"
	ipv4Only, both := ranged("203.0.113.0/24"), ranged("203.0.113.0/24", "2001:db8:7::/64")
	rangeCases := []struct {
		name     string
		pr       probe
		nftproxy string
		want     string
	}{
		{"IPv6 to a Service with IPv4 ranges only", probe{svc: ipv4Only, dst: dstIngress, src: srcOutsider, six: true},
			"drop", "Source ranges of the other family only"},
		{"IPv4 outside the ranges", probe{svc: ipv4Only, dst: dstIngress, src: srcOutsider}, "drop", ""},
		{"IPv6 with IPv6 ranges too", probe{svc: both, dst: dstIngress, src: srcOutsider, six: true}, "drop", ""},
		{"IPv6 to the ClusterIP", probe{svc: ipv4Only, dst: dstClusterIP, src: srcOutsider, six: true}, "drop", ""},
		{"IPv6 rejected instead", probe{svc: ipv4Only, dst: dstIngress, src: srcOutsider, six: true}, "reject", ""},
	}
	for _, tc := range rangeCases {
		if got := explain(tc.pr, tc.nftproxy, lb); got != tc.want {
			t.Errorf("%s: explained by %q, want %q", tc.name, got, tc.want)
		}
	}
}
