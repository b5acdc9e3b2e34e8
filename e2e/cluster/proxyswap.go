package cluster

import (
	"context"
	"errors"
	"fmt"
)

// Running several proxies one after another on the same node, over the same objects,
// compares them on equal terms (tools/bench's peer phase): a cluster built with NoProxy on
// that node, then StartProxy and StopProxy for each.

// StartProxy starts proxy p on node n, which must have none running, with extra flags
// after the lab's (for example --min-sync-period=0s). Close stops it, StopProxy sooner.
func (c *Cluster) StartProxy(ctx context.Context, n *Node, p Proxy, extra ...string) error {
	if n.ProxyProcess != nil && !n.ProxyProcess.Exited() {
		return fmt.Errorf("node %s: %s still runs", n.Spec.Name, n.Spec.Proxy)
	}
	n.Spec.Proxy = p
	n.ProxyProcess = nil
	return c.startProxy(ctx, n, extra...)
}

// StopProxy stops the proxy of node n and removes what it programmed, so that the next
// proxy starts from a clean node: every nftables table of the node's namespace (iptables-nft's
// among them) and the namespace's conntrack entries.
func (c *Cluster) StopProxy(ctx context.Context, n *Node) error {
	var errs []error
	if n.ProxyProcess != nil {
		errs = append(errs, n.ProxyProcess.Stop())
	}
	n.Spec.Proxy = NoProxy
	if _, err := n.Exec(ctx, "", "nft", "flush", "ruleset"); err != nil {
		errs = append(errs, fmt.Errorf("node %s: nft flush ruleset: %w", n.Spec.Name, err))
	}
	errs = append(errs, n.FlushConntrack())
	return errors.Join(errs...)
}
