package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/internal/testenv"
	"github.com/nftproxy/nftproxy/proxier/state"
)

// TestMain lets the test binary serve as the control-plane child, as the bench
// binary does: measureControl re-executes os.Executable().
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "child-control" {
		if err := runControlChild(os.Args[2:]); err != nil {
			os.Stderr.WriteString("bench: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestClusterMix(t *testing.T) {
	for _, n := range []int{100, 1000, 10000} {
		m := countMix(newCluster(n).state)
		pct := func(v int) float64 { return 100 * float64(v) / float64(n) }
		checks := []struct {
			what     string
			got      float64
			min, max float64
		}{
			{"ClusterIP", pct(m.ClusterIP), 70, 70},
			{"NodePort", pct(m.NodePort), 20, 20},
			{"LoadBalancer", pct(m.LoadBalancer), 10, 10},
			{"externalTrafficPolicy Local", pct(m.ETPLocal), 4, 6.5},
			{"sessionAffinity", pct(m.Affinity), 2, 2},
			{"loadBalancerSourceRanges", pct(m.SourceRanges), 0.5, 1.5},
		}
		for _, c := range checks {
			if c.got < c.min || c.got > c.max {
				t.Errorf("N=%d: %s is %.1f%% of Services, want %.1f..%.1f%%", n, c.what, c.got, c.min, c.max)
			}
		}
		if m.Services != n || m.Endpoints != n*endpointsPerService {
			t.Errorf("N=%d: %d Services with %d endpoints, want %d with %d", n, m.Services, m.Endpoints, n, n*endpointsPerService)
		}
	}
}

func TestClusterIsValid(t *testing.T) {
	for _, m := range []int{endpointsPerService, 10} {
		checkClusterValid(t, newClusterM(1000, m), m)
	}
	// At the plan's largest N, NodePorts still fit a port and stay distinct.
	c := newClusterM(maxServices, 1)
	ports := map[uint16]bool{}
	for _, svc := range c.state.Services {
		if np := svc.Ports[0].NodePort; np != 0 {
			if ports[np] || np < firstNodePort {
				t.Fatalf("N=%d: %s: node port %d reused or wrapped", maxServices, svc.Name, np)
			}
			ports[np] = true
		}
	}
	if len(ports) != maxServices*3/10 {
		t.Errorf("N=%d: %d node ports, want %d", maxServices, len(ports), maxServices*3/10)
	}
}

// checkClusterValid checks that c's addresses and ports are distinct and in their
// ranges, that every Service has m endpoints, and that a change toggles one.
func checkClusterValid(t *testing.T, c *cluster, m int) {
	t.Helper()
	seen := map[string]string{}
	claim := func(what, key string) {
		if prev, dup := seen[key]; dup {
			t.Fatalf("%s %s already used by %s", what, key, prev)
		}
		seen[key] = what
	}
	local := 0
	for _, svc := range c.state.Services {
		for _, a := range svc.ClusterIPs {
			claim(svc.Name.String()+" ClusterIP", a.String())
			if !serviceCIDR.Contains(a) {
				t.Errorf("%s: ClusterIP %s outside %s", svc.Name, a, serviceCIDR)
			}
		}
		for _, a := range svc.LoadBalancerIPs {
			claim(svc.Name.String()+" LB IP", a.String())
		}
		for _, p := range svc.Ports {
			if p.NodePort != 0 {
				claim(svc.Name.String()+" node port", "np/"+string(p.Protocol)+"/"+strconv.Itoa(int(p.NodePort)))
			}
			eps := c.state.Endpoints(svc, p)
			if len(eps) != m {
				t.Errorf("%s: %d endpoints, want %d", svc.Name, len(eps), m)
			}
			for _, e := range eps {
				claim(svc.Name.String()+" endpoint", e.Address.String())
				if !clusterCIDR.Contains(e.Address) {
					t.Errorf("%s: endpoint %s outside the cluster CIDR", svc.Name, e.Address)
				}
				if svc.ExternalPolicyLocal && e.NodeName == nodeName {
					local++
				}
			}
		}
	}
	if local == 0 {
		t.Error("no externalTrafficPolicy Local Service has an endpoint on this node")
	}
	// A change toggles the endpoint count between M and M+1.
	before := len(c.endpoints(c.names[3]))
	if ch := c.toggleEndpoint(3); !ch.Added || len(c.endpoints(c.names[3])) != before+1 {
		t.Errorf("first change of a Service: want an endpoint added")
	}
	if ch := c.toggleEndpoint(3); ch.Added || len(c.endpoints(c.names[3])) != before {
		t.Errorf("second change of a Service: want the endpoint removed")
	}
}

// TestKubeProxyText checks the shape of the iptables-restore text: one KUBE-SERVICES
// rule per frontend with the target last, probabilities 1/m, and large-cluster mode.
func TestKubeProxyText(t *testing.T) {
	c := newCluster(100)
	withTarget(c)
	k := newKubeProxy(c.state)
	if k.largeCluster {
		t.Errorf("100 Services x 5 endpoints: large-cluster mode on, want off")
	}
	text := k.restore(nil, nil).buf.String()
	var services []string
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "-A KUBE-SERVICES ") && strings.Contains(line, "-j KUBE-") {
			services = append(services, line)
		}
	}
	m := countMix(c.state)
	if want := m.Services + m.LoadBalancer + 1 + 1; len(services) != want-lbWithoutEndpoints(k) {
		t.Errorf("KUBE-SERVICES (nat) has %d jump rules, want %d", len(services), want-lbWithoutEndpoints(k))
	}
	if n := len(services); n < 2 || !strings.Contains(services[n-2], "zz-target/target:http cluster IP") || !strings.Contains(services[n-1], "KUBE-NODEPORTS") {
		t.Errorf("the target is not last in KUBE-SERVICES before the node ports rule:\n%s", strings.Join(services[max(0, len(services)-3):], "\n"))
	}
	for _, want := range []string{
		"--probability 0.2000000000", "--probability 0.2500000000", "--probability 0.5000000000",
		"-j DNAT --to-destination 10.200.0.10:8080", "-m recent --name KUBE-SEP-", "--rcheck --seconds 10800 --reap",
		"-j KUBE-FW-", "-A KUBE-EXT-", "-j KUBE-SVL-", "-m addrtype --src-type LOCAL -j KUBE-MARK-MASQ",
		"-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000", "-j MASQUERADE --random-fully",
		"-m comment --comment \"bench-000/svc-000000:http -> 10.1.0.1:8080\"",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("restore text has no %q", want)
		}
	}
	if big := newKubeProxy(newCluster(1000).state); !big.largeCluster || strings.Contains(big.restore(nil, nil).buf.String(), "-> 10.1.0.1:8080") {
		t.Errorf("1000 Services x 5 endpoints: want large-cluster mode, without per-endpoint comments")
	}
}

// lbWithoutEndpoints counts LoadBalancer frontends that have no KUBE-SERVICES jump
// (externalTrafficPolicy Local without a local endpoint: they are dropped in filter).
func lbWithoutEndpoints(k *kubeProxy) int {
	n := 0
	for _, svc := range k.st.Services {
		for _, p := range svc.Ports {
			if pi := k.portInfo(svc, p); len(svc.LoadBalancerIPs) > 0 && !pi.usesExternal {
				n += len(svc.LoadBalancerIPs)
			}
		}
	}
	return n
}

// TestKubeProxyTextLoads loads the text with iptables-restore inside `unshare -n`:
// --test for the full text, then a full load followed by a partial update (which
// deletes a stale endpoint chain), for each backend installed.
func TestKubeProxyTextLoads(t *testing.T) {
	testenv.RequireRoot(t, "unshare")
	c := newCluster(100)
	withTarget(c)
	k := newKubeProxy(c.state)
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	full := write("full", k.restore(nil, nil).buf.String())
	setup := write("setup", kubeSetup)
	name := c.names[5]
	c.toggleEndpoint(5)
	added := write("added", k.restore(nil, nil).buf.String())
	before := k.chainsOf(name)
	c.toggleEndpoint(5)
	partial := write("partial", k.restore(map[state.ServiceName]bool{name: true}, stale(before, k.chainsOf(name))).buf.String())
	if len(stale(before, k.chainsOf(name))) != 1 {
		t.Fatalf("removing an endpoint leaves %d stale chains, want 1", len(stale(before, k.chainsOf(name))))
	}
	ran := 0
	for _, backend := range []string{backendLegacy, backendNFT} {
		bin := restoreBinary(backend)
		if _, err := exec.LookPath(bin); err != nil {
			t.Logf("%s not found, skipped", bin)
			continue
		}
		ran++
		script := strings.Join([]string{
			bin + " --test < " + full,
			bin + " < " + setup,
			bin + " --noflush < " + full,
			bin + " --noflush < " + added,
			bin + " --noflush < " + partial,
		}, " && ")
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		out, err := exec.CommandContext(ctx, "unshare", "-n", "sh", "-c", script).CombinedOutput()
		cancel()
		if err != nil {
			t.Errorf("%s: %v\n%s", bin, err, out)
		}
	}
	if ran == 0 {
		t.Skip("no iptables-restore installed (make deps installs iptables)")
	}
}

func TestSummarize(t *testing.T) {
	s := summarize([]float64{5, 1, 4, 2, 3, 10, 9, 8, 7, 6})
	if s.N != 10 || s.Min != 1 || s.Max != 10 || s.P50 != 5 || s.P90 != 9 || s.P99 != 10 || s.Mean != 5.5 {
		t.Errorf("summarize = %+v", s)
	}
	if (summarize(nil) != Summary{}) {
		t.Error("summarize(nil) is not empty")
	}
}

func TestParseFlags(t *testing.T) {
	o, err := parseFlags([]string{"--quick"}, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	if got := o.sizes[len(o.sizes)-1]; got > 10000 {
		t.Errorf("--quick: largest N %d, want <= 10000", got)
	}
	o, err = parseFlags([]string{"--sizes", "50k,1k", "--phases", "control,sim"}, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	if len(o.sizes) != 2 || o.sizes[0] != 1000 || o.sizes[1] != 50000 || o.churnAt != 50000 || o.phases["baseline"] {
		t.Errorf("parsed %+v", o)
	}
	o, err = parseFlags([]string{"--sizes", "1000,100k", "--endpoints", "10", "--phases", "control"}, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	if o.endpoints != 10 || len(o.sizes) != 2 || o.sizes[1] != 100000 {
		t.Errorf("--endpoints 10 --sizes 1000,100k: parsed %+v", o)
	}
	if co := (controlOptions{N: 100000, Endpoints: 10}); !strings.Contains(strings.Join(co.args(), " "), "-endpoints 10") {
		t.Errorf("child arguments %q do not pass the endpoint count", co.args())
	}
	for _, bad := range [][]string{{"--sizes", "x"}, {"--phases", "nope"}, {"--iptables", "ebpf"}, {"extra"},
		{"--sizes", "200k", "--phases", "control"}, {"--endpoints", "0", "--phases", "control"},
		{"--sizes", "100k", "--endpoints", "101", "--phases", "control"}, {"--endpoints", "10"},
		{"--peer", "--peer-sizes", "100k"}} {
		if _, err := parseFlags(bad, os.Stderr); err == nil {
			t.Errorf("parseFlags(%q): no error", bad)
		}
	}
}

// TestBenchEndToEnd runs every phase at N=100 and checks the three outputs.
func TestBenchEndToEnd(t *testing.T) {
	testenv.RequireRoot(t, "nft")
	out := t.TempDir()
	o, err := parseFlags([]string{"--sizes", "100", "--dataplane-sizes", "100", "--sim-sizes", "100",
		"--updates", "4", "--churn", "500ms", "--connects", "100", "--sim-time", "200ms",
		"--nft-baseline-max", "0", "--cpu-profile", "--out", out}, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := run(ctx, o, newProgress(testWriter{t}))
	if err != nil {
		t.Fatal(err)
	}
	if err := res.write(out); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"results.json", "results.md", "plot.png", "cpu-100.pprof"} {
		if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s not written: %v", f, err)
		}
	}
	data, err := os.ReadFile(filepath.Join(out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var back Results
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatalf("results.json: %v", err)
	}
	if len(back.Control) != 1 || back.Control[0].Full.Operations == 0 || len(back.Control[0].Updates) != 4 || back.Control[0].Churn == nil {
		t.Errorf("control results: %+v", back.Control)
	}
	if len(back.DataPlane) == 0 || back.DataPlane[0].Connects == 0 {
		t.Errorf("data plane results: %+v", back.DataPlane)
	}
	if len(back.Sim) != 1 || back.Sim[0].Branches != endpointsPerService {
		t.Errorf("simulator results: %+v", back.Sim)
	}
	if len(back.Targets) == 0 {
		t.Error("no targets evaluated")
	}
	if _, err := exec.LookPath(restoreBinary(backendLegacy)); err == nil && len(back.Baseline) == 0 {
		t.Errorf("no baseline although %s is installed; errors: %q", restoreBinary(backendLegacy), back.Errors)
	}
	md, _ := os.ReadFile(filepath.Join(out, "results.md"))
	for _, want := range []string{"## Control plane (ours)", "## Data plane", "## Simulator", "## Targets"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("results.md has no %q", want)
		}
	}
}

// testWriter sends progress lines to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func TestCountTransports(t *testing.T) {
	us := []UpdateStats{
		{TotalMs: 1, Operations: 4, NetlinkElements: 4},
		{TotalMs: 3, Operations: 4, NetlinkElements: 4, Deleted: true},
		{TotalMs: 20, Operations: 12, Deleted: true},
		{TotalMs: 0.1}, // nothing to write
	}
	got := countTransports(us)
	want := transportCounts{Netlink: 2, NetlinkDeleting: 1, NFT: 1, NFTDeleting: 1, NetlinkP50Ms: 1, NFTP50Ms: 20}
	if got != want {
		t.Errorf("countTransports = %+v; want %+v", got, want)
	}
}
