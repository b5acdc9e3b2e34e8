package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/nftproxy/nftproxy/e2e/apiserver"
	"github.com/nftproxy/nftproxy/e2e/lab"
)

// Proxy is the service proxy a node runs.
type Proxy string

// The proxies a node can run.
const (
	// NftProxy is the nftproxy daemon built from this repository.
	NftProxy Proxy = "nftproxy"
	// KubeProxyNftables is the real kube-proxy in nftables mode.
	KubeProxyNftables Proxy = "kube-proxy-nftables"
	// KubeProxyIptables is the real kube-proxy in iptables mode (iptables-restore as the
	// machine has it, inside the node's namespace).
	KubeProxyIptables Proxy = "kube-proxy-iptables"
	// NoProxy leaves the node without a proxy.
	NoProxy Proxy = "none"
)

// NodeSpec describes one node.
type NodeSpec struct {
	// Name is the Node object's name and the proxy's --hostname-override.
	Name string
	// Proxy is the proxy the node runs.
	Proxy Proxy
	// Labels are added to the Node object's when it is registered, before its
	// proxy starts (a zone, for topology).
	Labels map[string]string
}

// Spec describes a cluster. Zero fields take the defaults of DefaultSpec.
type Spec struct {
	Nodes []NodeSpec
	// Segment is the L2 segment's prefix: the control plane has APIServerAddr in it, node i
	// (from 0) has the address NodeBase+i, and the external namespace, the nodes' default
	// gateway, has Gateway.
	Segment       netip.Prefix
	Gateway       netip.Addr
	APIServerAddr netip.AddrPort
	NodeBase      netip.Addr
	// ClusterCIDR holds the pod CIDRs; node i gets the /24 number i+1 of it.
	ClusterCIDR netip.Prefix
	ServiceCIDR netip.Prefix
	// DualStack adds IPv6 (dualstack.go): every namespace on the segment gets the address
	// of Segment6 whose last group reads as its IPv4 address's last byte, the nodes' pod
	// CIDRs of both families come from the node IPAM (ClusterCIDR's /24s, ClusterCIDR6's
	// /64s) instead of the lab, and ServiceCIDR6 is the API server's second service CIDR.
	DualStack                            bool
	Segment6, ClusterCIDR6, ServiceCIDR6 netip.Prefix
}

// DefaultSpec is three nodes: node-a and node-c run nftproxy, node-b kube-proxy
// (nftables mode).
func DefaultSpec() Spec {
	return Spec{
		Nodes: []NodeSpec{
			{Name: "node-a", Proxy: NftProxy},
			{Name: "node-b", Proxy: KubeProxyNftables},
			{Name: "node-c", Proxy: NftProxy},
		},
	}
}

func (s *Spec) defaults() error {
	if len(s.Nodes) == 0 {
		s.Nodes = DefaultSpec().Nodes
	}
	if !s.Segment.IsValid() {
		s.Segment = netip.MustParsePrefix("192.168.80.0/24")
	}
	if !s.Gateway.IsValid() {
		s.Gateway = netip.MustParseAddr("192.168.80.1")
	}
	if !s.APIServerAddr.IsValid() {
		s.APIServerAddr = netip.MustParseAddrPort("192.168.80.2:6443")
	}
	if !s.NodeBase.IsValid() {
		s.NodeBase = netip.MustParseAddr("192.168.80.11")
	}
	if !s.ClusterCIDR.IsValid() {
		s.ClusterCIDR = netip.MustParsePrefix("10.80.0.0/16")
	}
	if !s.ServiceCIDR.IsValid() {
		s.ServiceCIDR = netip.MustParsePrefix("172.30.0.0/16")
	}
	if !s.ClusterCIDR.Addr().Is4() || s.ClusterCIDR.Bits() > 16 {
		return fmt.Errorf("cluster CIDR %s: want IPv4, /16 or wider", s.ClusterCIDR)
	}
	if s.DualStack {
		if err := s.dualDefaults(); err != nil {
			return err
		}
	}
	if len(s.Nodes) > 200 {
		return fmt.Errorf("%d nodes: at most 200", len(s.Nodes))
	}
	seen := map[string]bool{}
	for _, n := range s.Nodes {
		if n.Name == "" || seen[n.Name] {
			return fmt.Errorf("node %q: names must be set and unique", n.Name)
		}
		seen[n.Name] = true
		switch n.Proxy {
		case NftProxy, KubeProxyNftables, KubeProxyIptables, NoProxy:
		default:
			return fmt.Errorf("node %s: unknown proxy %q", n.Name, n.Proxy)
		}
	}
	return nil
}

// Cluster is a running lab cluster. Its exported fields are read-only.
type Cluster struct {
	// ID is the random part of the namespace names: nftp-<ID>-cp and so on.
	ID   string
	Spec Spec
	Bin  Binaries
	// Dir holds the certificates, kubeconfigs, etcd's data and every process's log.
	Dir string
	// Segment is the namespace of the L2 segment's bridge; ControlPlane runs etcd,
	// kube-apiserver and kube-controller-manager; External is the nodes' default gateway,
	// a host that forwards nothing (as the world beyond a real cluster's gateway, it
	// swallows packets to addresses nobody has), and an external client.
	Segment, ControlPlane, External *lab.NS
	Nodes                           []*Node
	// CACert is the API server's self-signed certificate (PEM).
	CACert []byte
	// Kubeconfig is an admin kubeconfig for the API server's segment address.
	Kubeconfig string
	// Client is an admin client whose connections are made in the control plane's
	// namespace.
	Client kubernetes.Interface

	mu    sync.Mutex
	all   []*lab.NS // every namespace, in creation order
	procs []*apiserver.Process
	pods  []*Pod

	closeOnce sync.Once
	closeErr  error
}

// Node is a node namespace with its proxy.
type Node struct {
	*lab.NS
	Spec NodeSpec
	// Addr is the node's address on the segment (its InternalIP).
	Addr netip.Addr
	// PodCIDR is the node's pod CIDR; its first address is the pods' gateway.
	PodCIDR netip.Prefix
	// Addr6 and PodCIDR6 are their IPv6 twins in a dual-stack lab, else zero.
	Addr6    netip.Addr
	PodCIDR6 netip.Prefix
	// ProxyProcess is the running proxy, nil with NoProxy.
	ProxyProcess *apiserver.Process

	mu          sync.Mutex
	nextPod     int // pods made so far, for veth names and addresses
	proxyStarts int // proxies started so far, for their logs' names
}

// New builds the cluster of spec in fresh namespaces with its files in dir, starts the
// control plane, registers the nodes and starts their proxies. bin must hold every binary
// the spec's nodes run. On failure, and on panic, everything is removed again; on success
// the caller must Close the cluster.
func New(ctx context.Context, spec Spec, bin Binaries, dir string) (*Cluster, error) {
	if err := spec.defaults(); err != nil {
		return nil, fmt.Errorf("cluster spec: %w", err)
	}
	id := make([]byte, 3)
	if _, err := rand.Read(id); err != nil {
		return nil, err
	}
	c := &Cluster{ID: hex.EncodeToString(id), Spec: spec, Bin: bin, Dir: dir}
	built := false
	defer func() {
		if !built { // also reached while panicking
			_ = c.Close()
		}
	}()
	if err := c.build(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("cluster %s: %w", c.ID, err), c.Close())
	}
	built = true
	return c, nil
}

func (c *Cluster) newNS(role string, sysctls [][2]string) (*lab.NS, error) {
	ns, err := lab.NewNS(lab.NamePrefix + c.ID + "-" + role)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.all = append(c.all, ns)
	c.mu.Unlock()
	for _, kv := range sysctls {
		if err := ns.SetSysctl(kv[0], kv[1]); err != nil {
			return nil, err
		}
	}
	return ns, nil
}

func (c *Cluster) build(ctx context.Context) error {
	var err error
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return err
	}
	if c.Segment, err = c.newNS("seg", nil); err != nil {
		return err
	}
	if err := newSegment(c.Segment); err != nil {
		return err
	}
	if c.ControlPlane, err = c.newNS("cp", nil); err != nil {
		return err
	}
	bits := c.Spec.Segment.Bits()
	if err := plug(c.Segment, "cp", c.ControlPlane, netip.PrefixFrom(c.Spec.APIServerAddr.Addr(), bits)); err != nil {
		return err
	}
	if c.Spec.DualStack {
		if _, err := c.plug6(c.ControlPlane, c.Spec.APIServerAddr.Addr()); err != nil {
			return err
		}
	}
	if c.External, err = c.newNS("ext", nil); err != nil {
		return err
	}
	if err := plug(c.Segment, "ext", c.External, netip.PrefixFrom(c.Spec.Gateway, bits)); err != nil {
		return err
	}
	if c.Spec.DualStack {
		if _, err := c.plug6(c.External, c.Spec.Gateway); err != nil {
			return err
		}
	}
	for _, ns := range c.Spec.Nodes {
		if _, err := c.plugNode(ns); err != nil {
			return err
		}
	}
	if err := c.startControlPlane(ctx); err != nil {
		return err
	}
	if c.Client, err = kubernetes.NewForConfig(c.RESTConfig()); err != nil {
		return err
	}
	if err := c.applyDeployRBAC(ctx); err != nil {
		return err
	}
	for _, n := range c.Nodes {
		if err := c.registerNode(ctx, n); err != nil {
			return err
		}
		if err := c.startProxy(ctx, n); err != nil {
			return err
		}
	}
	return nil
}

// plugNode creates the namespace of node number len(c.Nodes), plugs it into the segment
// and routes: every node routes the other nodes' pod CIDRs to them, as a flat L2 CNI
// would, and the rest to the gateway: without a default route, traffic to a ClusterIP no
// rule translates would fail routing before the forward hook, where kube-proxy rejects
// Services without endpoints (and the kernel rate-limits its own unreachables).
//
// In a dual-stack lab the node gets its IPv6 address and default route too, and its pod
// CIDRs and their routes wait for the node IPAM (registerNode).
func (c *Cluster) plugNode(spec NodeSpec) (*Node, error) {
	i := len(c.Nodes)
	n := &Node{Spec: spec, Addr: c.nodeAddr(i)}
	sysctls := routerSysctls
	if c.Spec.DualStack {
		sysctls = append(slices.Clone(sysctls), router6Sysctls...)
	}
	var err error
	if n.NS, err = c.newNS(spec.Name, sysctls); err != nil {
		return nil, err
	}
	if err := plug(c.Segment, fmt.Sprintf("n%d", i), n.NS, netip.PrefixFrom(n.Addr, c.Spec.Segment.Bits())); err != nil {
		return nil, err
	}
	if err := addRoute(n.NS, "eth0", netip.Prefix{}, c.Spec.Gateway); err != nil {
		return nil, err
	}
	if c.Spec.DualStack {
		if n.Addr6, err = c.plug6(n.NS, n.Addr); err != nil {
			return nil, err
		}
		if err := addRoute(n.NS, "eth0", netip.MustParsePrefix("::/0"), c.Spec.addr6(c.Spec.Gateway)); err != nil {
			return nil, err
		}
		c.Nodes = append(c.Nodes, n)
		return n, nil
	}
	n.PodCIDR = c.podCIDR(i)
	if err := c.routePods(n); err != nil {
		return nil, err
	}
	c.Nodes = append(c.Nodes, n)
	return n, nil
}

// routePods routes, in both directions, between node n and every other node with pod
// CIDRs: each one's pod CIDRs (IPv6 too in a dual-stack lab) through its segment
// addresses, as a flat L2 CNI would.
func (c *Cluster) routePods(n *Node) error {
	for _, m := range c.Nodes {
		if m == n || !m.PodCIDR.IsValid() {
			continue
		}
		routes := []struct {
			from, to *Node
		}{{n, m}, {m, n}}
		for _, r := range routes {
			if err := addRoute(r.from.NS, "eth0", r.to.PodCIDR, r.to.Addr); err != nil {
				return err
			}
			if r.to.PodCIDR6.IsValid() {
				if err := addRoute(r.from.NS, "eth0", r.to.PodCIDR6, r.to.Addr6); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// nodeAddr is the segment address of node i: NodeBase+i.
func (c *Cluster) nodeAddr(i int) netip.Addr { return nthAfter(c.Spec.NodeBase, i) }

// podCIDR is the pod CIDR of node i: the /24 number i+1 of the cluster CIDR.
func (c *Cluster) podCIDR(i int) netip.Prefix {
	a := c.Spec.ClusterCIDR.Masked().Addr().As4()
	a[2] += byte(i + 1)
	return netip.PrefixFrom(netip.AddrFrom4(a), 24)
}

// start starts a process of the cluster inside ns; Close stops it.
func (c *Cluster) start(ns *lab.NS, label, bin string, args ...string) (*apiserver.Process, error) {
	p, err := apiserver.Start(ns, c.Dir, label, bin, args...)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	return p, nil
}

// conntrackFlags leave every conntrack sysctl as it is: several are global to the
// machine, not to the node's namespace.
var conntrackFlags = []string{
	"--conntrack-max-per-core=0", "--conntrack-min=0",
	"--conntrack-tcp-timeout-established=0s", "--conntrack-tcp-timeout-close-wait=0s",
	"--conntrack-udp-timeout=0s", "--conntrack-udp-timeout-stream=0s",
}

// startProxy starts the node's proxy: nftproxy with the DaemonSet's command line and
// deploy/'s files, kube-proxy as kubeadm runs it but with flags; extra flags come last.
func (c *Cluster) startProxy(ctx context.Context, n *Node, extra ...string) error {
	var (
		bin  string
		args []string
	)
	switch n.Spec.Proxy {
	case NoProxy:
		return nil
	case NftProxy:
		if c.Bin.NftProxy == "" {
			return fmt.Errorf("node %s: no nftproxy binary (Binaries.BuildNftProxy)", n.Spec.Name)
		}
		bin = c.Bin.NftProxy
		var err error
		if args, err = c.nftproxyArgs(ctx, n); err != nil {
			return err
		}
	case KubeProxyNftables, KubeProxyIptables:
		mode := map[Proxy]string{KubeProxyNftables: "nftables", KubeProxyIptables: "iptables"}[n.Spec.Proxy]
		bin = c.Bin.KubeProxy
		args = []string{"--proxy-mode=" + mode, "--kubeconfig=" + c.kubeconfigPath("system:kube-proxy"),
			"--hostname-override=" + n.Spec.Name, "--cluster-cidr=" + c.Spec.ClusterCIDRs(),
			"--healthz-bind-address=0.0.0.0:10256", "--metrics-bind-address=127.0.0.1:10249",
			"--oom-score-adj=0", "--v=2"}
	}
	args = append(args, conntrackFlags...)
	args = append(args, extra...)
	// Each start of a node's proxy has its own log.
	label := n.Spec.Name + "-" + string(n.Spec.Proxy)
	if n.proxyStarts++; n.proxyStarts > 1 {
		label += fmt.Sprintf("-%d", n.proxyStarts)
	}
	p, err := c.start(n.NS, label, bin, args...)
	if err != nil {
		return fmt.Errorf("node %s: %w", n.Spec.Name, err)
	}
	n.ProxyProcess = p
	return nil
}

// nftproxyArgs writes deploy/'s files for the node and returns the DaemonSet's command
// line for them (with its takeover from kube-proxy, which changes nothing on a node
// kube-proxy never ran on).
func (c *Cluster) nftproxyArgs(ctx context.Context, n *Node) ([]string, error) {
	config, kubeconfig, err := c.deployFiles(ctx, n)
	if err != nil {
		return nil, err
	}
	return []string{"--config=" + config, "--kubeconfig=" + kubeconfig, "--hostname-override=" + n.Spec.Name,
		"--cleanup-table-after-sync=kube-proxy", "--cleanup-kube-proxy-iptables"}, nil
}

// Node returns the node called name, or nil.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes {
		if n.Spec.Name == name {
			return n
		}
	}
	return nil
}

// Processes returns every process the cluster started, in start order.
func (c *Cluster) Processes() []*apiserver.Process {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*apiserver.Process(nil), c.procs...)
}

// Close stops the proxies, the control plane and the pods' echo servers, and removes
// every namespace; it works on a half-built cluster too. It is idempotent.
func (c *Cluster) Close() error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		procs, pods, all := c.procs, c.pods, c.all
		c.mu.Unlock()
		var errs []error
		// Proxies (started last) first, etcd last.
		for i := len(procs) - 1; i >= 0; i-- {
			errs = append(errs, procs[i].Stop())
		}
		for _, p := range pods {
			errs = append(errs, p.stop())
		}
		for i := len(all) - 1; i >= 0; i-- {
			errs = append(errs, all[i].Close())
		}
		c.closeErr = errors.Join(errs...)
	})
	return c.closeErr
}

// defaultWait bounds the lab's waits for the control plane's controllers.
const defaultWait = 30 * time.Second

// waitFor polls cond every 200ms until it is true, fails or the timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		ok, err := cond()
		if err == nil && ok {
			return nil
		}
		if err != nil {
			last = err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not within %v (last error: %v)", what, timeout, last)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", what, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}
