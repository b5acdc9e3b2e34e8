package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nftproxy/nftproxy/e2e/lab"
)

// TestExternalTrafficPolicyLocal sends traffic from the external namespace to every node's
// node port of a LoadBalancer Service with externalTrafficPolicy Local, and asks every
// node's health-check node port, as a cloud load balancer does: nodes with a local
// endpoint answer 200 and serve it with the client's source kept; nodes without answer 503
// and drop the traffic — the same on nftproxy and kube-proxy nodes.
func TestExternalTrafficPolicyLocal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	spec := DefaultSpec()
	spec.Nodes = append(spec.Nodes, NodeSpec{Name: "node-d", Proxy: KubeProxyNftables})
	c := startCluster(t, ctx, spec)

	const echoPort = 8080
	web := map[string]string{"app": "lb"}
	addPods(t, ctx, c,
		PodSpec{Name: "lb-b", Node: "node-b", Labels: web, Ports: []uint16{echoPort}}, // kube-proxy
		PodSpec{Name: "lb-c", Node: "node-c", Labels: web, Ports: []uint16{echoPort}}, // nftproxy
	)
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "lb", Namespace: "default"},
		Spec: v1.ServiceSpec{
			Type:                  v1.ServiceTypeLoadBalancer,
			ExternalTrafficPolicy: v1.ServiceExternalTrafficPolicyLocal,
			Selector:              web,
			Ports:                 []v1.ServicePort{{Name: "echo", Port: 80, TargetPort: intstr.FromInt32(echoPort), Protocol: v1.ProtocolTCP}},
		},
	}
	var created *v1.Service
	err := waitFor(ctx, defaultWait, "create service default/lb", func() (bool, error) {
		var err error
		created, err = c.Client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
		return err == nil, err
	})
	if err != nil {
		t.Fatal(err)
	}
	nodePort, hcPort := uint16(created.Spec.Ports[0].NodePort), uint16(created.Spec.HealthCheckNodePort)
	t.Logf("node port %d, health-check node port %d", nodePort, hcPort)
	waitEndpoints(t, ctx, c, "lb", map[string]string{"lb-b": "RS-", "lb-c": "RS-"})

	local := map[string]string{"node-b": "lb-b", "node-c": "lb-c"} // node -> its local pod
	const conns = 20
	for _, n := range c.Nodes {
		dst := netip.AddrPortFrom(n.Addr, nodePort)
		wantPod, has := local[n.Spec.Name]
		wantCode := http.StatusServiceUnavailable
		if has {
			wantCode = http.StatusOK
		}
		// The health check first: once it says the node's state, its rules say it too.
		var code int
		var body string
		err := waitFor(ctx, 10*time.Second, "health check of "+n.Spec.Name, func() (bool, error) {
			var err error
			code, body, err = httpGet(ctx, c.External, fmt.Sprintf("http://%s/", netip.AddrPortFrom(n.Addr, hcPort)))
			return err == nil && code == wantCode && localEndpoints(body) == map[bool]int{true: 1, false: 0}[has], err
		})
		t.Logf("%s (%s): health check %d %s", n.Spec.Name, n.Spec.Proxy, code, strings.TrimSpace(body))
		if err != nil {
			t.Errorf("%s (%s): health check: want %d: %v", n.Spec.Name, n.Spec.Proxy, wantCode, err)
			continue
		}
		// A dropped connection costs its whole timeout, so fewer of them say as much.
		tries, timeout := conns, time.Second
		if !has {
			tries, timeout = 5, 500*time.Millisecond
		}
		var got tally
		err = waitFor(ctx, 10*time.Second, "node port of "+n.Spec.Name, func() (bool, error) {
			got = connectFrom(c.External, dst, tries, timeout)
			if !has {
				return got.failures[lab.TimedOut] == tries, nil
			}
			return got.reached[wantPod] == conns && got.sources[c.Spec.Gateway] == conns, nil
		})
		t.Logf("%s (%s): %d connections from %s to %s: %v, sources %v", n.Spec.Name, n.Spec.Proxy, tries,
			c.Spec.Gateway, dst, got, got.sources)
		if err != nil {
			t.Errorf("%s (%s): want %s", n.Spec.Name, n.Spec.Proxy, map[bool]string{
				true: "every connection answered by " + wantPod + " seeing the client's own address", false: "every connection dropped"}[has])
		}
	}
}

// connectFrom makes n TCP connections from ns to dst, each given timeout.
func connectFrom(ns *lab.NS, dst netip.AddrPort, n int, timeout time.Duration) tally {
	t := tally{reached: map[string]int{}, failures: map[lab.Outcome]int{}, sources: map[netip.Addr]int{}}
	for range n {
		r, err := ns.Echo(lab.Request{Proto: lab.TCP, Dst: dst, Timeout: timeout})
		if err != nil {
			t.failures[lab.Classify(err)]++
			continue
		}
		t.reached[r.Pod]++
		t.sources[r.Source.Addr()]++
	}
	return t
}

// localEndpoints reads localEndpoints from a health-check answer, -1 if absent.
func localEndpoints(body string) int {
	var v struct {
		LocalEndpoints *int `json:"localEndpoints"`
	}
	if json.Unmarshal([]byte(body), &v) != nil || v.LocalEndpoints == nil {
		return -1
	}
	return *v.LocalEndpoints
}
