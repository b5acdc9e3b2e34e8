package cluster

import (
	"slices"
	"strings"
	"testing"
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
}
