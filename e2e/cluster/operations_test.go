package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nftproxy/nftproxy/e2e/lab"
)

// Operations with clients connected throughout: every test here runs Traffic from pods on
// every node (and from outside) while it operates on the nodes' proxies, and counts the
// connections that failed.

// The ports of the operations' Service "web": port 80 to the pods' echo port (one answer
// per connection), port 90 to their stream port (long-lived connections).
const (
	opsEchoPort   = 8080
	opsStreamPort = 9000
	opsClusterIP  = "172.30.0.20"
)

var opsLabels = map[string]string{"app": "web"}

// opsPods adds a backend web-NODE (echo and stream ports) and a client client-NODE on
// every node.
func opsPods(t *testing.T, ctx context.Context, c *Cluster) map[string]*Pod {
	t.Helper()
	var specs []PodSpec
	for _, n := range c.Nodes {
		specs = append(specs,
			PodSpec{Name: "web-" + n.Spec.Name, Node: n.Spec.Name, Labels: opsLabels,
				Ports: []uint16{opsEchoPort}, StreamPorts: []uint16{opsStreamPort}},
			PodSpec{Name: "client-" + n.Spec.Name, Node: n.Spec.Name})
	}
	return addPods(t, ctx, c, specs...)
}

// createOpsService creates the Service "web" of type typ (ClusterIP, NodePort or
// LoadBalancer) with the policy etp for external traffic (NodePort and LoadBalancer) and
// waits for its endpoints: the web pods, ready.
func createOpsService(t *testing.T, ctx context.Context, c *Cluster, typ v1.ServiceType, etp v1.ServiceExternalTrafficPolicy, pods map[string]*Pod) *v1.Service {
	t.Helper()
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: v1.ServiceSpec{
			Type: typ, ClusterIP: opsClusterIP, Selector: opsLabels,
			Ports: []v1.ServicePort{
				{Name: "echo", Port: 80, TargetPort: intstr.FromInt32(opsEchoPort), Protocol: v1.ProtocolTCP},
				{Name: "stream", Port: 90, TargetPort: intstr.FromInt32(opsStreamPort), Protocol: v1.ProtocolTCP},
			},
		},
	}
	if typ != v1.ServiceTypeClusterIP {
		svc.Spec.ExternalTrafficPolicy = etp
	}
	var created *v1.Service
	err := waitFor(ctx, defaultWait, "create service default/web", func() (bool, error) {
		var err error
		created, err = c.Client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
		return err == nil, err
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for name, p := range pods {
		if p.Spec.Labels["app"] == "web" {
			want[name] = "RS-"
		}
	}
	waitEndpoints(t, ctx, c, "web", want)
	return created
}

// opsClients starts a Traffic from every client pod to the ClusterIP (new connections to
// port 80, two held connections to port 90) once each has been answered, and, when the
// Service has node ports, one from the external namespace to every node's node ports.
func opsClients(t *testing.T, ctx context.Context, c *Cluster, pods map[string]*Pod, svc *v1.Service) map[string]*Traffic {
	t.Helper()
	ip := netip.MustParseAddr(opsClusterIP)
	echo, stream := netip.AddrPortFrom(ip, 80), netip.AddrPortFrom(ip, 90)
	specs := map[string]TrafficSpec{}
	for _, n := range c.Nodes {
		name := "client-" + n.Spec.Name
		if p := pods[name]; p != nil {
			specs[name] = TrafficSpec{Name: name, From: p.NS, Targets: []netip.AddrPort{echo}, Held: []netip.AddrPort{stream, stream}}
		}
	}
	if np := svc.Spec.Ports[0].NodePort; np != 0 {
		ext := TrafficSpec{Name: "external", From: c.External}
		for _, n := range c.Nodes {
			ext.Targets = append(ext.Targets, netip.AddrPortFrom(n.Addr, uint16(np)))
			ext.Held = append(ext.Held, netip.AddrPortFrom(n.Addr, uint16(svc.Spec.Ports[1].NodePort)))
		}
		specs["external"] = ext
	}
	traffic := map[string]*Traffic{}
	for name, spec := range specs {
		for _, dst := range spec.Targets {
			waitAnswer(t, ctx, spec.From, name, dst)
		}
		tr, err := StartTraffic(spec)
		if err != nil {
			t.Fatal(err)
		}
		traffic[name] = tr
		t.Cleanup(func() { tr.Stop() })
	}
	return traffic
}

// waitAnswer waits until a connection from ns to dst is answered: the proxies have the
// Service.
func waitAnswer(t *testing.T, ctx context.Context, ns *lab.NS, who string, dst netip.AddrPort) {
	t.Helper()
	err := waitFor(ctx, defaultWait, who+": first answer from "+dst.String(), func() (bool, error) {
		_, err := ns.Echo(lab.Request{Proto: lab.TCP, Dst: dst, Timeout: time.Second})
		return err == nil, err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// stopClients stops every Traffic, logs its counts and returns them.
func stopClients(t *testing.T, traffic map[string]*Traffic) map[string]TrafficCounts {
	t.Helper()
	out := map[string]TrafficCounts{}
	for name, tr := range traffic {
		out[name] = tr.Stop()
		t.Logf("%s: %v", name, out[name])
	}
	return out
}

// failures sums the failures and the new connections of every client.
func failures(counts map[string]TrafficCounts) (total, attempts int) {
	for _, c := range counts {
		total += c.Failures()
		attempts += c.Attempts
	}
	return total, attempts
}

// snapshot sums the failures of every Traffic so far.
func snapshot(traffic map[string]*Traffic) (failed, attempts int) {
	counts := map[string]TrafficCounts{}
	for name, tr := range traffic {
		counts[name] = tr.Snapshot()
	}
	return failures(counts)
}

// lastSync reads kubeproxy_sync_proxy_rules_last_timestamp_seconds of the IPv4 family
// (the lab's Services are IPv4) from the node's proxy (127.0.0.1:10249/metrics, both
// proxies): zero before its first sync.
func lastSync(ctx context.Context, n *Node) (time.Time, error) {
	code, body, err := httpGet(ctx, n.NS, "http://127.0.0.1:10249/metrics")
	if err != nil {
		return time.Time{}, err
	}
	if code != 200 {
		return time.Time{}, fmt.Errorf("metrics of %s: status %d", n.Spec.Name, code)
	}
	for _, l := range strings.Split(body, "\n") {
		name, value, ok := strings.Cut(l, " ")
		if !ok || (name != syncMetric && name != syncMetric+`{ip_family="IPv4"}`) {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return time.Time{}, fmt.Errorf("metrics of %s: %q: %w", n.Spec.Name, l, err)
		}
		if v == 0 {
			return time.Time{}, nil
		}
		return time.Unix(0, int64(v*1e9)), nil
	}
	return time.Time{}, nil
}

// syncMetric is the time of a proxy's last sync, kube-proxy's metric (nftproxy has it too).
const syncMetric = "kubeproxy_sync_proxy_rules_last_timestamp_seconds"

// waitSynced waits until the node's proxy has synced IPv4 since after (its /healthz
// cannot say it: kube-proxy's answers 200 before its first sync), and returns how long
// after after that was.
func waitSynced(t *testing.T, ctx context.Context, c *Cluster, n *Node, after time.Time) time.Duration {
	t.Helper()
	var last time.Time
	err := waitFor(ctx, defaultWait, "node "+n.Spec.Name+": "+string(n.Spec.Proxy)+" synced", func() (bool, error) {
		if p := n.ProxyProcess; p != nil && p.Exited() {
			return false, fmt.Errorf("%s exited:\n%s", n.Spec.Proxy, p.Tail(2000))
		}
		var err error
		last, err = lastSync(ctx, n)
		return err == nil && last.After(after), err
	})
	if err != nil {
		t.Fatal(err)
	}
	return last.Sub(after)
}

// TestOperationsRollingRestart kills every nftproxy by its PID, one node at a time, and
// starts it again, with clients connected throughout: the node's rules stay while no
// proxy runs, the new process adopts its table, and no connection fails.
func TestOperationsRollingRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := startCluster(t, ctx, DefaultSpec())
	pods := opsPods(t, ctx, c)
	svc := createOpsService(t, ctx, c, v1.ServiceTypeNodePort, v1.ServiceExternalTrafficPolicyCluster, pods)
	traffic := opsClients(t, ctx, c, pods, svc)
	time.Sleep(time.Second)
	restarted := 0
	for _, n := range c.Nodes {
		if n.Spec.Proxy != NftProxy {
			continue
		}
		if err := c.KillProxy(ctx, n); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second) // a node without its proxy for a while
		start := time.Now()
		if err := c.StartProxy(ctx, n, NftProxy); err != nil {
			t.Fatal(err)
		}
		took := waitSynced(t, ctx, c, n, start)
		failed, attempts := snapshot(traffic)
		t.Logf("%s: nftproxy killed, started again, synced %v after its start; so far %d failures in %d new connections",
			n.Spec.Name, took.Round(time.Millisecond), failed, attempts)
		restarted++
		time.Sleep(time.Second)
	}
	counts := stopClients(t, traffic)
	failed, attempts := failures(counts)
	t.Logf("rolling restart of %d nftproxy: %d failed of %d new connections, held connections broken: %d",
		restarted, failed, attempts, heldBroken(counts))
	if restarted == 0 || failed > 0 {
		t.Errorf("rolling restart of %d nftproxy: want 0 failures, got %d", restarted, failed)
	}
}

// heldBroken sums the broken held connections.
func heldBroken(counts map[string]TrafficCounts) int {
	n := 0
	for _, c := range counts {
		n += c.HeldBroken
	}
	return n
}
