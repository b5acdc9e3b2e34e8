package cluster

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/e2e/lab"
)

// TestTerminatingEndpoints scales a Service down through terminating pods, with the
// conditions written by the real EndpointSlice controller, and checks that clients behind
// nftproxy and behind kube-proxy (nftables mode) reach the same pods at every step: ready
// endpoints only while there are some, then the serving terminating ones, then a refusal.
func TestTerminatingEndpoints(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := startCluster(t, ctx, DefaultSpec())

	const echoPort = 8080
	dst := netip.AddrPortFrom(netip.MustParseAddr("172.30.0.11"), 80)
	web := map[string]string{"app": "web"}
	pods := addPods(t, ctx, c,
		PodSpec{Name: "web-b", Node: "node-b", Labels: web, Ports: []uint16{echoPort}},
		PodSpec{Name: "web-c", Node: "node-c", Labels: web, Ports: []uint16{echoPort}},
		PodSpec{Name: "client-a", Node: "node-a"}, // nftproxy
		PodSpec{Name: "client-b", Node: "node-b"}, // kube-proxy
	)
	createService(t, ctx, c, "web", dst.Addr(), dst.Port(), echoPort, web)
	clients := []*Pod{pods["client-a"], pods["client-b"]}

	const conns = 30
	steps := []struct {
		name      string
		act       func() error
		endpoints map[string]string // conditions the controller writes
		reached   []string          // the pods every client must reach, and only they
		outcome   lab.Outcome       // else, the failure of every connection
	}{
		{"two ready pods", func() error { return nil },
			map[string]string{"web-b": "RS-", "web-c": "RS-"}, []string{"web-b", "web-c"}, ""},
		{"web-c terminating", func() error { return c.Terminate(ctx, pods["web-c"], time.Minute) },
			map[string]string{"web-b": "RS-", "web-c": "-ST"}, []string{"web-b"}, ""},
		{"both terminating: the serving ones", func() error { return c.Terminate(ctx, pods["web-b"], time.Minute) },
			map[string]string{"web-b": "-ST", "web-c": "-ST"}, []string{"web-b", "web-c"}, ""},
		{"web-c gone", func() error { return c.Remove(ctx, pods["web-c"]) },
			map[string]string{"web-b": "-ST"}, []string{"web-b"}, ""},
		{"no endpoints: refused", func() error { return c.Remove(ctx, pods["web-b"]) },
			map[string]string{}, nil, lab.Refused},
	}
	for _, st := range steps {
		acted := time.Now()
		if err := st.act(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		waitEndpoints(t, ctx, c, "web", st.endpoints)
		sliced := time.Now()
		for _, p := range clients {
			node := c.Node(p.Spec.Node)
			// Every proxy applies the change within its minimum sync period (1s for
			// both): wait until a quick round of connections has the new outcome, then
			// make a full round.
			want := map[string]bool{}
			for _, name := range st.reached {
				want[name] = true
			}
			matches := func(got tally, n int) bool {
				if st.outcome != "" {
					return len(got.reached) == 0 && got.failures[st.outcome] == n
				}
				seen := map[string]bool{}
				for name := range got.reached {
					seen[name] = true
				}
				return len(got.failures) == 0 && maps.Equal(seen, want)
			}
			// A removed pod's address is refused by the gateway its node routes it to, so
			// a quick round can look converged before the proxy has synced; wait for a
			// sync since the step (the proxy may have synced before the test saw the
			// slice).
			waitSynced(t, ctx, c, node, acted)
			const quick = 12
			last := ""
			err := waitFor(ctx, 20*time.Second, st.name, func() (bool, error) {
				got := connectWithin(p, dst, quick, 300*time.Millisecond)
				if s := got.String(); s != last {
					t.Logf("%s: %s: at %v: %d quick connections: %s", st.name, p.Spec.Name, time.Since(sliced).Round(time.Millisecond), quick, s)
					last = s
				}
				return matches(got, quick), nil
			})
			converged := time.Since(sliced)
			got := connect(p, dst, conns)
			if err == nil && !matches(got, conns) {
				err = fmt.Errorf("want %v %s in every connection", st.reached, st.outcome)
			}
			t.Logf("%s: %s on %s (%s): new outcome %v after the slice; then %d connections: %v", st.name, p.Spec.Name,
				node.Spec.Name, node.Spec.Proxy, converged.Round(time.Millisecond), conns, got)
			if err != nil {
				t.Errorf("%s: %s on %s (%s): %v; got %v", st.name, p.Spec.Name, node.Spec.Name, node.Spec.Proxy, err, got)
			}
		}
	}
}
