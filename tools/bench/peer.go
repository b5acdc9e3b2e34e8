package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	labcluster "github.com/nftproxy/nftproxy/e2e/cluster"
)

// The peer phase: nftproxy beside the real kube-proxy (v1.37.2, nftables and iptables
// mode) on the cluster lab's real kube-apiserver, one proxy at a time on the same node
// namespace, over the same objects.

// peerOptions are the peer phase's flags.
type peerOptions struct {
	enabled    bool
	sizes      []int
	proxies    []string
	minSyncs   []string
	changes    int
	cpuChanges int
	changeRate float64
	idle       time.Duration
	timeout    time.Duration
	iptables   string
	workers    int
}

// peerFlags registers the peer phase's flags on fs; the returned function checks them
// once fs is parsed.
func peerFlags(fs *flag.FlagSet, o *peerOptions) func() error {
	var sizes, proxies, syncs string
	fs.BoolVar(&o.enabled, "peer", false, "run only the peer phase: nftproxy beside the real kube-proxy (nftables and iptables mode) on a real API server (needs the binaries of make apiserver)")
	fs.StringVar(&sizes, "peer-sizes", "1000,10000", "peer phase N, comma-separated (50000 works; creating its objects takes several minutes)")
	fs.StringVar(&proxies, "peer-proxies", "kube-proxy-nftables,kube-proxy-iptables,nftproxy", "proxies of the peer phase, in order")
	fs.StringVar(&syncs, "peer-min-sync", "0s", "min-sync-period of the peer phase's proxies, comma-separated (e.g. 0s,1s; 1s is both's default)")
	fs.IntVar(&o.changes, "peer-changes", 20, "changes whose network programming latency is measured, per proxy")
	fs.IntVar(&o.cpuChanges, "peer-cpu-changes", 100, "endpoint changes whose CPU is measured, per proxy")
	fs.Float64Var(&o.changeRate, "peer-change-rate", 10, "rate of those changes, per second")
	fs.DurationVar(&o.idle, "peer-idle", 60*time.Second, "time over which idle CPU is measured (the default holds two of the proxies' periodic syncs, --sync-period 30s)")
	fs.DurationVar(&o.timeout, "peer-timeout", 10*time.Minute, "bound of one proxy's start to programmed")
	fs.StringVar(&o.iptables, "peer-iptables", "legacy", "iptables of kube-proxy's iptables mode: legacy, or nft (the machine's iptables-nft 1.8.9, whose first sync at 10k took over 5 minutes here)")
	fs.IntVar(&o.workers, "peer-workers", 16, "API requests in flight while creating the objects")
	return func() error {
		var err error
		if o.sizes, err = parseSizes(sizes); err != nil {
			return fmt.Errorf("-peer-sizes: %w", err)
		}
		o.proxies = strings.Split(proxies, ",")
		for _, p := range o.proxies {
			if peerOrder(p) == len(peerProxyNames) {
				return fmt.Errorf("-peer-proxies: unknown proxy %q", p)
			}
		}
		for _, s := range strings.Split(syncs, ",") {
			if d, err := time.ParseDuration(s); err != nil || d < 0 {
				return fmt.Errorf("-peer-min-sync: %q: want a duration >= 0", s)
			}
			o.minSyncs = append(o.minSyncs, s)
		}
		if o.iptables != backendLegacy && o.iptables != backendNFT {
			return fmt.Errorf("-peer-iptables %q: want legacy or nft", o.iptables)
		}
		if o.changes < 1 || o.cpuChanges < 1 || o.changeRate <= 0 || o.workers < 1 {
			return errors.New("-peer-changes, -peer-cpu-changes, -peer-change-rate and -peer-workers must be positive")
		}
		return nil
	}
}

// peerLab is the peer phase's cluster: one node without a proxy of its own, a client pod
// and backend pods on it, the probe Service and the generated objects.
type peerLab struct {
	c        *labcluster.Cluster
	node     *labcluster.Node
	client   *labcluster.Pod
	backends []*labcluster.Pod
	objs     *peerObjects
	probe    *discoveryv1.EndpointSlice
	probeDst netip.AddrPort
	// cur is the backend the probe Service points at.
	cur int
	// legacyBin holds iptables commands that run iptables-legacy.
	legacyBin string
}

const peerNS = "zz-peer"

// runPeer runs the peer phase and records it in res.
func runPeer(ctx context.Context, o peerOptions, p *progress, res *Results) error {
	pr := &PeerResults{Machine: cpuModel(), Iptables: o.iptables}
	res.Peer = pr
	p.setPhase("peer: cluster")
	root, err := repoRoot()
	if err != nil {
		return err
	}
	bin, err := labcluster.FindBinaries(root)
	if err != nil {
		return fmt.Errorf("peer: %w", err)
	}
	dir, err := os.MkdirTemp("", "nftproxy-bench-peer-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := bin.BuildNftProxy(root, dir); err != nil {
		return fmt.Errorf("peer: %w", err)
	}
	c, err := labcluster.New(ctx, labcluster.Spec{Nodes: []labcluster.NodeSpec{{Name: "node-0", Proxy: labcluster.NoProxy}}}, bin, filepath.Join(dir, "lab"))
	if err != nil {
		return fmt.Errorf("peer: %w", err)
	}
	defer func() {
		if err := c.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "bench: peer: removing the cluster: %v\n", err)
		}
	}()
	pl := &peerLab{c: c, node: c.Nodes[0], objs: &peerObjects{client: c.Client}}
	if o.iptables == backendLegacy {
		if pl.legacyBin, err = legacyIptablesDir(dir); err != nil {
			return fmt.Errorf("peer: %w", err)
		}
	}
	if err := pl.setup(ctx); err != nil {
		return fmt.Errorf("peer: %w", err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range o.sizes {
		p.setPhase("peer N=%s", short(n))
		before := len(pl.objs.slices)
		t0 := time.Now()
		if err := p.during("creating Services", 20*time.Second, func() error { return pl.objs.grow(ctx, n, o.workers) }); err != nil {
			return fmt.Errorf("peer N=%d: %w", n, err)
		}
		cr := PeerCreate{N: n, Services: n - before, Endpoints: (n - before) * endpointsPerService, Seconds: time.Since(t0).Seconds()}
		pr.Creates = append(pr.Creates, cr)
		p.printf("created %d Services and their EndpointSlices in %.1f s", cr.Services, cr.Seconds)
		for _, ms := range o.minSyncs {
			for _, proxy := range o.proxies {
				p.setPhase("peer N=%s %s min-sync-period %s", short(n), proxy, ms)
				run := pl.measure(ctx, p, o, rng, n, proxy, ms)
				pr.Runs = append(pr.Runs, run)
				if ctx.Err() != nil {
					return ctx.Err()
				}
				if run.Error != "" {
					res.Errors = append(res.Errors, fmt.Sprintf("peer N=%d %s: %s", n, proxy, run.Error))
				}
			}
		}
	}
	return nil
}

// setup creates the client pod, the backend pods and the probe Service, which points at
// the first backend.
func (pl *peerLab) setup(ctx context.Context) error {
	if err := createNamespace(ctx, pl.c.Client, peerNS); err != nil {
		return err
	}
	var err error
	if pl.client, err = pl.c.AddPod(ctx, labcluster.PodSpec{Namespace: peerNS, Name: "client", Node: pl.node.Spec.Name}); err != nil {
		return err
	}
	for i := range 3 {
		b, err := pl.c.AddPod(ctx, labcluster.PodSpec{Namespace: peerNS, Name: fmt.Sprintf("backend-%d", i), Node: pl.node.Spec.Name, Ports: []uint16{targetPort}})
		if err != nil {
			return err
		}
		pl.backends = append(pl.backends, b)
	}
	svc, err := pl.c.Client.CoreV1().Services(peerNS).Create(ctx, peerService(peerNS, "probe"), metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("service %s/probe: %w", peerNS, err)
	}
	ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
	if err != nil {
		return fmt.Errorf("service %s/probe: clusterIP %q: %w", peerNS, svc.Spec.ClusterIP, err)
	}
	pl.probeDst = netip.AddrPortFrom(ip, servicePort)
	sl := peerSlice(peerNS, "probe", []netip.Addr{pl.backends[0].Addr}, pl.node.Spec.Name)
	if pl.probe, err = pl.c.Client.DiscoveryV1().EndpointSlices(peerNS).Create(ctx, sl, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("endpointslice of %s/probe: %w", peerNS, err)
	}
	return nil
}

// moveProbe points the probe Service at the next backend and returns its name.
func (pl *peerLab) moveProbe(ctx context.Context) (string, error) {
	next := (pl.cur + 1) % len(pl.backends)
	sl := pl.probe.DeepCopy()
	sl.Endpoints = peerSlice(peerNS, "probe", []netip.Addr{pl.backends[next].Addr}, pl.node.Spec.Name).Endpoints
	up, err := pl.c.Client.DiscoveryV1().EndpointSlices(peerNS).Update(ctx, sl, metav1.UpdateOptions{})
	if err != nil {
		return "", fmt.Errorf("endpointslice of %s/probe: %w", peerNS, err)
	}
	pl.probe, pl.cur = up, next
	return pl.backends[next].Spec.Name, nil
}

// legacyIptablesDir makes a directory of iptables commands that run iptables-legacy, for
// kube-proxy's PATH.
func legacyIptablesDir(dir string) (string, error) {
	multi := "/usr/sbin/xtables-legacy-multi"
	if _, err := os.Stat(multi); err != nil {
		return "", fmt.Errorf("iptables-legacy: %w (or -peer-iptables=nft)", err)
	}
	bin := filepath.Join(dir, "iptables-legacy-bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return "", err
	}
	for _, name := range []string{"iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"} {
		if err := os.Symlink(multi, filepath.Join(bin, name)); err != nil {
			return "", err
		}
	}
	return bin, nil
}

// repoRoot returns the repository: the working directory or the nearest one above it
// with go.mod.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("peer: no go.mod in %s or above: run the bench from the repository", dir)
		}
	}
}

// proxyFlags are the flags the peer phase gives proxy: its min-sync-period.
func proxyFlags(proxy, minSync string) []string {
	if proxy == string(labcluster.NftProxy) {
		return []string{"--min-sync-period=" + minSync}
	}
	// kube-proxy's --iptables-min-sync-period sets the period of the nftables mode too.
	return []string{"--iptables-min-sync-period=" + minSync}
}
