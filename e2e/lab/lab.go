package lab

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"
)

// podGateway6 is the link-local address of the node side of every pod veth, the IPv6
// gateway of the pods. A link-local gateway never becomes the source of routed or
// masqueraded traffic, which keeps the node's eth0 address visible to pods.
var podGateway6 = netip.MustParseAddr("fe80::1")

// Lab is a built topology. Its exported fields are read-only.
type Lab struct {
	// ID is the random part of the lab's namespace names: nftp-<ID>-node and so on.
	ID string
	// Spec is the spec the lab was built from, with defaults filled in.
	Spec Spec
	// Node is the node under test, where nftables rulesets are loaded.
	Node *NS
	// Remote is the remote node, nil without Spec.Remote.
	Remote *NS
	// Client is the external client, nil without Spec.Client.
	Client *NS

	pods   []*Pod
	all    []*NS           // every namespace created, in creation order
	stubs  map[string]bool // "netns/link" of links whose peer stays down
	addrs6 []addr6         // IPv6 addresses configured, to wait for

	closeOnce sync.Once
	closeErr  error
}

// Pod is a pod namespace with its echo servers running.
type Pod struct {
	*NS
	// Name is the pod's name, as its echo servers report it (NS.Name() is its namespace's).
	Name string
	// Addrs are the pod's addresses.
	Addrs []netip.Addr
	// Ports are the pod's echo ports.
	Ports []uint16
	// HostVeth is the name of the pod veth's end in the namespace of the pod's node.
	HostVeth string
	// Remote tells whether the pod runs on the remote node.
	Remote bool

	echo *EchoServer
}

// IPv4 returns the pod's IPv4 address, or the zero Addr.
func (p *Pod) IPv4() netip.Addr { return pick(p.Addrs, false) }

// IPv6 returns the pod's IPv6 address, or the zero Addr.
func (p *Pod) IPv6() netip.Addr { return pick(p.Addrs, true) }

func pick(as []netip.Addr, v6 bool) netip.Addr {
	for _, a := range as {
		if a.Is6() == v6 {
			return a
		}
	}
	return netip.Addr{}
}

// New builds the topology of spec in fresh namespaces and starts the pods' echo servers.
// On failure, and on panic, everything built so far is removed again; on success the caller
// must Close the lab.
func New(spec Spec) (*Lab, error) {
	spec, err := spec.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("lab spec: %w", err)
	}
	id := make([]byte, 3)
	if _, err := rand.Read(id); err != nil {
		return nil, fmt.Errorf("lab id: %w", err)
	}
	l := &Lab{ID: hex.EncodeToString(id), Spec: spec}
	built := false
	defer func() {
		if !built { // also reached while panicking
			_ = l.Close()
		}
	}()
	if err := l.build(); err != nil {
		return nil, errors.Join(fmt.Errorf("lab %s: %w", l.ID, err), l.Close()) // Close is idempotent
	}
	built = true
	return l, nil
}

// newNS creates a namespace of the lab and routes it if it is a node.
func (l *Lab) newNS(role string, router bool) (*NS, error) {
	ns, err := NewNS(NamePrefix + l.ID + "-" + role)
	if err != nil {
		return nil, err
	}
	l.all = append(l.all, ns)
	if router {
		for _, kv := range [][2]string{
			{"net.ipv4.ip_forward", "1"},
			{"net.ipv6.conf.all.forwarding", "1"},
			// Deterministic rejects: no per-destination ICMP rate limit.
			{"net.ipv4.icmp_ratelimit", "0"},
			{"net.ipv6.icmp.ratelimit", "0"},
		} {
			if err := ns.SetSysctl(kv[0], kv[1]); err != nil {
				return nil, err
			}
		}
	}
	return ns, nil
}

func (l *Lab) build() error {
	s := l.Spec
	var err error
	if l.Node, err = l.newNS("node", true); err != nil {
		return err
	}
	// Node eth0: towards the client, or a stub holding the node addresses.
	if s.Client != nil {
		if l.Client, err = l.newNS("client", false); err != nil {
			return err
		}
		if err := addVeth(l.Node, "eth0", l.Client, "eth0"); err != nil {
			return err
		}
		if err := l.configure(l.Client, "eth0", s.Client.Addrs); err != nil {
			return err
		}
		if err := defaultRoutes(l.Client, "eth0", s.NodeAddrs); err != nil {
			return err
		}
		if err := pairNeighbors(l.Node, "eth0", hosts(s.NodeAddrs), l.Client, "eth0", hosts(s.Client.Addrs)); err != nil {
			return err
		}
	} else if err := l.addStub(l.Node, "eth0", "eth0-peer", false); err != nil {
		return err
	}
	if err := l.configure(l.Node, "eth0", s.NodeAddrs); err != nil {
		return err
	}
	if err := l.addStub(l.Node, "void0", "void0-peer", true); err != nil {
		return err
	}
	if err := l.configure(l.Node, "void0", nil); err != nil {
		return err
	}
	if err := l.Node.Do(func() error {
		return voidDefaults(l.Node.name, "void0")
	}); err != nil {
		return err
	}
	if s.Remote != nil {
		r := s.Remote
		if l.Remote, err = l.newNS("remote", true); err != nil {
			return err
		}
		if err := addVeth(l.Node, "eth1", l.Remote, "eth0"); err != nil {
			return err
		}
		if err := l.configure(l.Node, "eth1", r.NodeAddrs); err != nil {
			return err
		}
		if err := l.configure(l.Remote, "eth0", r.Addrs); err != nil {
			return err
		}
		if err := defaultRoutes(l.Remote, "eth0", r.NodeAddrs); err != nil {
			return err
		}
		if err := pairNeighbors(l.Node, "eth1", hosts(r.NodeAddrs), l.Remote, "eth0", hosts(r.Addrs)); err != nil {
			return err
		}
		if err := l.Node.Do(func() error {
			for _, c := range r.PodCIDRs {
				if err := addRoute(l.Node.name, "eth1", c, first(r.Addrs, c.Addr().Is6()), false); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			return err
		}
	}
	for i, ps := range s.Pods {
		if err := l.addPod(ps, i, l.Node, s.NodeAddrs, false); err != nil {
			return err
		}
	}
	if s.Remote != nil {
		for i, ps := range s.Remote.Pods {
			if err := l.addPod(ps, i, l.Remote, s.Remote.Addrs, true); err != nil {
				return err
			}
		}
	}
	return l.waitReady(10 * time.Second)
}

// addPod creates a pod namespace wired to host and starts its echo servers.
func (l *Lab) addPod(ps PodSpec, index int, host *NS, hostAddrs []netip.Prefix, remote bool) error {
	ns, err := l.newNS("pod-"+ps.Name, false)
	if err != nil {
		return err
	}
	p := &Pod{NS: ns, Name: ps.Name, Addrs: ps.Addrs, Ports: ps.Ports, Remote: remote,
		HostVeth: l.Spec.VethPrefix + strconv.Itoa(index)}
	l.pods = append(l.pods, p)
	if err := addVeth(host, p.HostVeth, ns, "eth0"); err != nil {
		return err
	}
	var hostLL []netip.Prefix
	if p.IPv6().IsValid() {
		hostLL = []netip.Prefix{netip.PrefixFrom(podGateway6, 64)}
	}
	if err := l.configure(host, p.HostVeth, hostLL); err != nil {
		return err
	}
	var podAddrs []netip.Prefix
	for _, a := range ps.Addrs {
		podAddrs = append(podAddrs, netip.PrefixFrom(a, a.BitLen()))
	}
	if err := l.configure(ns, "eth0", podAddrs); err != nil {
		return err
	}
	if err := host.Do(func() error {
		for _, a := range podAddrs {
			if err := addRoute(host.name, p.HostVeth, a, netip.Addr{}, false); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return err
	}
	if err := ns.Do(func() error {
		for _, a := range ps.Addrs {
			gw := podGateway6
			if a.Is4() {
				gw = first(hostAddrs, false)
			}
			if err := addRoute(ns.name, "eth0", netip.Prefix{}, gw, a.Is4()); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return err
	}
	gws := []netip.Addr{}
	if p.IPv4().IsValid() {
		gws = append(gws, first(hostAddrs, false))
	}
	if p.IPv6().IsValid() {
		gws = append(gws, podGateway6)
	}
	if err := pairNeighbors(host, p.HostVeth, gws, ns, "eth0", ps.Addrs); err != nil {
		return err
	}
	p.echo, err = startEcho(ns, p.Name, p.Addrs, p.Ports)
	return err
}

// Pods returns the pods of the node and then those of the remote node, in spec order.
func (l *Lab) Pods() []*Pod { return append([]*Pod(nil), l.pods...) }

// Pod returns the pod called name, or nil.
func (l *Lab) Pod(name string) *Pod {
	for _, p := range l.pods {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// Namespaces returns every namespace of the lab.
func (l *Lab) Namespaces() []*NS { return append([]*NS(nil), l.all...) }

// Close stops the echo servers and removes every namespace of the lab, and with them every
// veth; it works on a half-built lab too. It is idempotent.
func (l *Lab) Close() error {
	l.closeOnce.Do(func() {
		var errs []error
		for _, p := range l.pods {
			if p.echo != nil {
				errs = append(errs, p.echo.Stop())
			}
		}
		for i := len(l.all) - 1; i >= 0; i-- {
			errs = append(errs, l.all[i].Close())
		}
		l.closeErr = errors.Join(errs...)
	})
	return l.closeErr
}

// dumpScript prints a namespace's state, for Dump; every command only reads.
const dumpScript = `ip -s -s link; ip -br addr; ip route; ip -6 route; ip neigh; ` +
	`nft list ruleset; nstat -as`

// Dump describes the state of every namespace of the lab (links, addresses, routes,
// neighbors, nftables ruleset, drop counters) for a failed spec's report.
func (l *Lab) Dump(ctx context.Context) string {
	var b strings.Builder
	for _, ns := range l.all {
		out, err := ns.Exec(ctx, "", "sh", "-c", dumpScript)
		fmt.Fprintf(&b, "=== %s\n%s", ns.name, out)
		if err != nil {
			fmt.Fprintf(&b, "(%v)\n", err)
		}
	}
	return b.String()
}
