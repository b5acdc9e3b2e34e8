package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Operations on a running cluster's nodes, as an operator (or the kubelet acting for a
// DaemonSet) does them: stop or kill a node's proxy leaving its rules, run nftproxy's
// one-shot commands in the node, label a node, add a node.

// TerminateProxy stops the node's proxy as the kubelet stops a pod: SIGTERM, SIGKILL after
// 10s. Both proxies leave their rules in place when they stop.
func (c *Cluster) TerminateProxy(n *Node) error {
	if n.ProxyProcess == nil {
		return fmt.Errorf("node %s: no proxy runs", n.Spec.Name)
	}
	return n.ProxyProcess.Stop()
}

// KillProxy kills the node's proxy by its PID with SIGKILL and waits until it has exited.
func (c *Cluster) KillProxy(ctx context.Context, n *Node) error {
	p := n.ProxyProcess
	if p == nil || p.Exited() {
		return fmt.Errorf("node %s: no proxy runs", n.Spec.Name)
	}
	if err := syscall.Kill(p.Cmd.Process.Pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("node %s: kill %s (pid %d): %w", n.Spec.Name, n.Spec.Proxy, p.Cmd.Process.Pid, err)
	}
	return waitFor(ctx, 10*time.Second, "node "+n.Spec.Name+": killed "+string(n.Spec.Proxy)+" exits", func() (bool, error) {
		return p.Exited(), nil
	})
}

// NftProxyOnce runs the nftproxy binary with args in the node's namespace and waits for it,
// as a one-shot container or `kubectl debug node` would (--cleanup, --init-only).
func (c *Cluster) NftProxyOnce(ctx context.Context, n *Node, args ...string) (string, error) {
	if c.Bin.NftProxy == "" {
		return "", fmt.Errorf("node %s: no nftproxy binary (Binaries.BuildNftProxy)", n.Spec.Name)
	}
	return n.Exec(ctx, "", c.Bin.NftProxy, args...)
}

// NftProxyInitOnly runs the DaemonSet's `nftproxy --init-only` step on the node, with the
// configuration and flags the node's nftproxy would start with.
func (c *Cluster) NftProxyInitOnly(ctx context.Context, n *Node) (string, error) {
	args, err := c.nftproxyArgs(ctx, n)
	if err != nil {
		return "", err
	}
	return c.NftProxyOnce(ctx, n, append(append(args, conntrackFlags...), "--init-only")...)
}

// Tables lists the node's nftables tables, as "FAMILY NAME".
func (c *Cluster) Tables(ctx context.Context, n *Node) ([]string, error) {
	out, err := n.Exec(ctx, "", "nft", "list", "tables")
	if err != nil {
		return nil, err
	}
	var tables []string
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "table" {
			tables = append(tables, f[1]+" "+f[2])
		}
	}
	slices.Sort(tables)
	return tables, nil
}

// LabelNode sets the label key of the node called name to value, or removes it when value
// is empty.
func (c *Cluster) LabelNode(ctx context.Context, name, key, value string) error {
	v := any(value)
	if value == "" {
		v = nil // a merge patch's null removes the key
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{key: v}}})
	if err != nil {
		return err
	}
	if _, err := c.Client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("node %s: label %s=%q: %w", name, key, value, err)
	}
	return nil
}

// AddNode adds a node to the running cluster: its namespace on the segment with the next
// address and pod CIDR, routes between it and every node, its Node object, and its proxy
// (started after the Node exists, as a DaemonSet's pod is).
func (c *Cluster) AddNode(ctx context.Context, spec NodeSpec) (*Node, error) {
	if spec.Name == "" || c.Node(spec.Name) != nil {
		return nil, fmt.Errorf("node %q: names must be set and unique", spec.Name)
	}
	n, err := c.plugNode(spec)
	if err != nil {
		return nil, err
	}
	c.Spec.Nodes = append(c.Spec.Nodes, spec)
	if err := c.registerNode(ctx, n); err != nil {
		return nil, err
	}
	if err := c.startProxy(ctx, n); err != nil {
		return nil, err
	}
	return n, nil
}
