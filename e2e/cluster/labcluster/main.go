// Command labcluster brings the cluster lab up for a person (`make cluster`): the real
// control plane and three nodes, nftproxy or kube-proxy on each, a demo Service with pods.
// It prints the kubeconfig and how to enter a node and trace a packet there, stays until
// Ctrl-C, then removes everything, also on failure. It needs root and the binaries of
// `make apiserver`.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/nftproxy/nftproxy/e2e/cluster"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "labcluster:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		nodes = flag.String("nodes", "node-a=nftproxy,node-b=kube-proxy-nftables,node-c=nftproxy",
			"the nodes, NAME=PROXY comma separated; PROXY is nftproxy, kube-proxy-nftables, kube-proxy-iptables or none")
		repo = flag.String("repo", ".", "the repository, where cmd/nftproxy and .cache/apiserver are")
		demo = flag.Bool("demo", true, "create Service default/web (ClusterIP 172.30.0.10:80) with a pod on each of the first two nodes, and a client pod on every node")
		dual = flag.Bool("dual-stack", false, "IPv6 too: segment fd00:192:168:80::/64, pod CIDRs from the node IPAM, services fd00:172:30::/112 (web is PreferDualStack)")
	)
	flag.Parse()
	if os.Geteuid() != 0 {
		return errors.New("needs root to create network namespaces")
	}
	spec := cluster.DefaultSpec()
	spec.Nodes, spec.DualStack = nil, *dual
	for _, f := range strings.Split(*nodes, ",") {
		name, proxy, ok := strings.Cut(strings.TrimSpace(f), "=")
		if !ok {
			return fmt.Errorf("--nodes: %q is not NAME=PROXY", f)
		}
		spec.Nodes = append(spec.Nodes, cluster.NodeSpec{Name: name, Proxy: cluster.Proxy(proxy)})
	}
	bin, err := cluster.FindBinaries(*repo)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "nftproxy-cluster-")
	if err != nil {
		return err
	}
	fmt.Printf("building nftproxy into %s\n", dir)
	if err := bin.BuildNftProxy(*repo, dir); err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	c, err := cluster.New(ctx, spec, bin, dir)
	if err != nil {
		return err
	}
	defer func() {
		fmt.Println("removing the cluster")
		if err := c.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "labcluster: close:", err)
		}
		fmt.Printf("removed; logs and kubeconfigs stay in %s\n", dir)
	}()
	fmt.Printf("cluster %s up in %v\n\n", c.ID, time.Since(start).Round(time.Millisecond))
	var client *cluster.Pod
	if *demo {
		if client, err = demoWorkload(ctx, c); err != nil {
			return err
		}
	}
	describe(c, client)

	// Stay until Ctrl-C, or until a process of the cluster dies.
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			fmt.Println()
			return nil
		case <-tick.C:
			for _, p := range c.Processes() {
				if p.Exited() {
					return fmt.Errorf("%s exited; its log: %s\n%s", p.Name, p.Log, p.Tail(2000))
				}
			}
		}
	}
}

// demoWorkload creates Service default/web with a pod on each of the first two nodes,
// and a client pod on every node; it returns the first node's client.
func demoWorkload(ctx context.Context, c *cluster.Cluster) (*cluster.Pod, error) {
	web := map[string]string{"app": "web"}
	var first *cluster.Pod
	for i, n := range c.Nodes {
		if i < 2 {
			if _, err := c.AddPod(ctx, cluster.PodSpec{Name: "web-" + n.Spec.Name, Node: n.Spec.Name, Labels: web, Ports: []uint16{8080}}); err != nil {
				return nil, err
			}
		}
		p, err := c.AddPod(ctx, cluster.PodSpec{Name: "client-" + n.Spec.Name, Node: n.Spec.Name})
		if err != nil {
			return nil, err
		}
		if first == nil {
			first = p
		}
	}
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: v1.ServiceSpec{
			ClusterIP: "172.30.0.10",
			Selector:  web,
			// One ClusterIP per family the cluster has: the IPv4 one given, the IPv6 one allocated.
			IPFamilyPolicy: ptr.To(v1.IPFamilyPolicyPreferDualStack),
			Ports:          []v1.ServicePort{{Name: "echo", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: v1.ProtocolTCP}},
		},
	}
	// The API server makes its default ServiceCIDR just after start.
	var err error
	for range 50 {
		if _, err = c.Client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err == nil {
			return first, nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return nil, fmt.Errorf("create service default/web: %w", err)
}

// describe prints how to use the cluster; client is a demo client pod, or nil.
func describe(c *cluster.Cluster, client *cluster.Pod) {
	cp := "ip netns exec " + c.ControlPlane.Name()
	kubectl := c.Bin.Kubectl
	if abs, err := filepath.Abs(kubectl); err == nil {
		kubectl = abs
	}
	fmt.Printf("API server https://%s, reachable from the lab's namespaces only.\n", c.Spec.APIServerAddr)
	fmt.Printf("kubeconfig (admin): %s\n", c.Kubeconfig)
	fmt.Printf("kubectl:            %s %s --kubeconfig %s get nodes,pods,endpointslices -o wide\n", cp, kubectl, c.Kubeconfig)
	fmt.Printf("logs:               %s/*.log\n\n", c.Dir)
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tADDRESS\tPOD CIDR\tPROXY\tENTER")
	for _, n := range c.Nodes {
		addr, cidr := n.Addr.String(), n.PodCIDR.String()
		if n.Addr6.IsValid() {
			addr, cidr = addr+","+n.Addr6.String(), cidr+","+n.PodCIDR6.String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\tip netns exec %s bash\n", n.Spec.Name, addr, cidr, n.Spec.Proxy, n.Name())
	}
	_ = tw.Flush()
	fmt.Printf("\nIn a node: `nft list ruleset`, `conntrack -L`; trace a packet through its live ruleset:\n")
	if client != nil {
		n := c.Node(client.Spec.Node)
		fmt.Printf("  ip netns exec %s go run ./tools/nftrace --live 'tcp %s:40000 -> 172.30.0.10:80 iif %s'\n",
			n.Name(), client.Addr, client.HostVeth)
		fmt.Printf("Connect from a client pod (the answer names the pod and the source it saw):\n")
		fmt.Printf("  ip netns exec %s bash -c 'exec 3<>/dev/tcp/172.30.0.10/80; echo >&3; cat <&3'\n", client.Name())
	} else {
		fmt.Printf("  ip netns exec %s go run ./tools/nftrace --live 'tcp %s:40000 -> 172.30.0.10:80 iif veth1'\n",
			c.Nodes[0].Name(), c.Nodes[0].PodCIDR.Addr().Next().Next())
	}
	fmt.Printf("\nCtrl-C removes everything.\n")
}
