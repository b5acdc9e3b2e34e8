package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/nftproxy/nftproxy/proxier/state"
)

// kubeProxy writes the ruleset upstream kube-proxy's iptables mode would write for
// a cluster, as iptables-restore input, following pkg/proxy/iptables/proxier.go
// (v1.29+): in nat, KUBE-SERVICES is a linear chain with one rule per frontend
// jumping to KUBE-SVC-<hash> (or KUBE-EXT-/KUBE-FW- for external frontends), the
// KUBE-SVC chains pick an endpoint with `-m statistic --mode random
// --probability`, and each endpoint has a KUBE-SEP chain that marks hairpin
// traffic for masquerade and DNATs; KUBE-NODEPORTS, KUBE-EXT, KUBE-SVL, KUBE-FW,
// KUBE-MARK-MASQ and KUBE-POSTROUTING complete it. The filter table carries the
// drops for Services without (local) endpoints, the firewall drops and the
// forwarding rules.
//
// The order of KUBE-SERVICES is the Services' name order; the data-plane target
// ("zz-target/target") comes last, which is its worst case.
type kubeProxy struct {
	st    *state.ClusterState
	order []state.ServiceName
	// largeCluster drops the comments of per-endpoint rules, as kube-proxy does past
	// largeClusterEndpointsThreshold (1000) endpoints to cut the restore size by
	// some 40%.
	largeCluster bool
}

// largeClusterEndpointsThreshold is kube-proxy's threshold of its large-cluster mode.
const largeClusterEndpointsThreshold = 1000

// newKubeProxy returns the kube-proxy generator for st. Services added to st later
// must be added with add.
func newKubeProxy(st *state.ClusterState) *kubeProxy {
	k := &kubeProxy{st: st}
	for n := range st.Services {
		k.order = append(k.order, n)
	}
	slices.SortFunc(k.order, func(a, b state.ServiceName) int { return strings.Compare(a.String(), b.String()) })
	eps := 0
	for _, bySlice := range st.Slices {
		for _, sl := range bySlice {
			eps += len(sl.Endpoints)
		}
	}
	k.largeCluster = eps > largeClusterEndpointsThreshold
	return k
}

// kubeSetup is what kube-proxy installs once with `iptables -I` at start: the jumps
// from the built-in chains to its own. It is loaded (untimed) before the first sync.
const kubeSetup = `*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
COMMIT
`

// portChainSuffix returns the hash kube-proxy names a Service port's chains with:
// base32 of sha256 of "namespace/name:port" + protocol, 16 characters.
func portChainSuffix(name state.ServicePortName) string {
	h := sha256.Sum256([]byte(fmt.Sprintf("%s:%s%s", name.ServiceName, name.Port, strings.ToLower(string(name.Protocol)))))
	return base32.StdEncoding.EncodeToString(h[:])[:16]
}

// endpointChain returns the KUBE-SEP chain of an endpoint of a Service port.
func endpointChain(name state.ServicePortName, ep string) string {
	h := sha256.Sum256([]byte(fmt.Sprintf("%s:%s%s%s", name.ServiceName, name.Port, strings.ToLower(string(name.Protocol)), ep)))
	return "KUBE-SEP-" + base32.StdEncoding.EncodeToString(h[:])[:16]
}

// restoreText is the iptables-restore input of one kube-proxy sync, and its size.
type restoreText struct {
	buf   *bytes.Buffer
	rules int
	// chains is the number of chains declared.
	chains int
}

// portInfo is what kube-proxy computes for a Service port before writing it.
type portInfo struct {
	svc              *state.Service
	port             state.ServicePort
	name             state.ServicePortName
	comment          string // "ns/name:port"
	svcChain         string
	localChain       string
	extChain         string
	fwChain          string
	cluster, local   []state.Endpoint
	hasExternal      bool // has node ports, external IPs or LB IPs
	usesExternal     bool // the EXT chain exists
	usesLocal        bool // the SVL chain exists
	clusterEndpoints bool
	localEndpoints   bool
}

func (k *kubeProxy) portInfo(svc *state.Service, p state.ServicePort) *portInfo {
	name := svc.PortName(p)
	suffix := portChainSuffix(name)
	pi := &portInfo{
		svc: svc, port: p, name: name,
		comment:    fmt.Sprintf("%s:%s", svc.Name, p.Name),
		svcChain:   "KUBE-SVC-" + suffix,
		localChain: "KUBE-SVL-" + suffix,
		extChain:   "KUBE-EXT-" + suffix,
		fwChain:    "KUBE-FW-" + suffix,
	}
	sel := state.Select(svc, k.st.Endpoints(svc, p), k.st.Node)
	pi.cluster, pi.local = sel.Cluster, sel.Local
	pi.clusterEndpoints, pi.localEndpoints = len(sel.Cluster) > 0, len(sel.Local) > 0
	pi.hasExternal = p.NodePort != 0 || len(svc.ExternalIPs) > 0 || len(svc.LoadBalancerIPs) > 0
	externalEndpoints := pi.clusterEndpoints
	if svc.ExternalPolicyLocal {
		externalEndpoints = pi.localEndpoints
	}
	pi.usesExternal = pi.hasExternal && externalEndpoints
	pi.usesLocal = svc.ExternalPolicyLocal && pi.usesExternal && pi.localEndpoints
	return pi
}

// chainsOf returns the nat chains that Service name's ports have, for finding the
// chains a partial sync must delete.
func (k *kubeProxy) chainsOf(name state.ServiceName) []string {
	svc := k.st.Services[name]
	if svc == nil {
		return nil
	}
	var out []string
	for _, p := range svc.Ports {
		pi := k.portInfo(svc, p)
		if pi.clusterEndpoints {
			out = append(out, pi.svcChain)
		}
		if pi.usesLocal {
			out = append(out, pi.localChain)
		}
		if pi.usesExternal {
			out = append(out, pi.extChain)
			if len(svc.SourceRanges) > 0 && len(svc.LoadBalancerIPs) > 0 {
				out = append(out, pi.fwChain)
			}
		}
		for _, e := range slices.Concat(pi.cluster, pi.local) {
			out = append(out, endpointChain(pi.name, e.AddrPort().String()))
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// restore writes the iptables-restore input of a sync. With only nil it is a full
// sync (every chain declared, flushed and rewritten, as kube-proxy did before
// MinimizeIPTablesRestore and still does on its periodic full sync); otherwise it is
// a partial sync of kube-proxy >= 1.27: KUBE-SERVICES, KUBE-NODEPORTS and the filter
// table are rewritten whole, but only the chains of the Services in only are, and
// stale lists chains to delete. The text is meant for `iptables-restore --noflush`.
func (k *kubeProxy) restore(only map[state.ServiceName]bool, stale []string) restoreText {
	var (
		filterChains, natChains   []string
		filterRules, natRules     bytes.Buffer
		svcsRules, nodeportsRules bytes.Buffer
		rules                     int
	)
	rule := func(b *bytes.Buffer, parts ...string) {
		b.WriteString("-A")
		for _, p := range parts {
			if p != "" {
				b.WriteByte(' ')
				b.WriteString(p)
			}
		}
		b.WriteByte('\n')
		rules++
	}
	quote := func(s string) string {
		if strings.ContainsAny(s, " ") {
			return `"` + s + `"`
		}
		return s
	}
	filterChains = append(filterChains, "KUBE-NODEPORTS", "KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-FORWARD", "KUBE-PROXY-FIREWALL")
	natChains = append(natChains, "KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-MARK-MASQ")
	clusterCIDRs := clusterCIDR.String()

	for _, name := range k.order {
		svc := k.st.Services[name]
		if svc == nil {
			continue
		}
		write := only == nil || only[name]
		for _, p := range svc.Ports {
			pi := k.portInfo(svc, p)
			proto := string(p.Protocol)
			match := func(addr string, port uint16) string {
				return fmt.Sprintf("-m %s -p %s -d %s --dport %d", proto, proto, addr, port)
			}
			if svc.HealthCheckNodePort != 0 {
				rule(&filterRules, "KUBE-NODEPORTS", "-m comment --comment", quote(pi.comment+" health check node port"),
					fmt.Sprintf("-m tcp -p tcp --dport %d -j ACCEPT", svc.HealthCheckNodePort))
			}
			// ClusterIP.
			for _, a := range svc.ClusterIPs {
				if pi.clusterEndpoints {
					rule(&svcsRules, "KUBE-SERVICES", "-m comment --comment", quote(pi.comment+" cluster IP"), match(a.String(), p.Port), "-j", pi.svcChain)
				} else {
					rule(&filterRules, "KUBE-SERVICES", "-m comment --comment", quote(pi.comment+" has no endpoints"), match(a.String(), p.Port), "-j REJECT")
				}
			}
			// LoadBalancer IPs and node port.
			extTarget := pi.extChain
			if len(svc.SourceRanges) > 0 && len(svc.LoadBalancerIPs) > 0 {
				extTarget = pi.fwChain
			}
			for _, a := range svc.LoadBalancerIPs {
				if pi.usesExternal {
					rule(&svcsRules, "KUBE-SERVICES", "-m comment --comment", quote(pi.comment+" loadbalancer IP"), match(a.String(), p.Port), "-j", extTarget)
					if len(svc.SourceRanges) > 0 {
						rule(&filterRules, "KUBE-PROXY-FIREWALL", "-m comment --comment", quote(pi.comment+" traffic not accepted by "+pi.fwChain), match(a.String(), p.Port), "-j DROP")
					}
				} else {
					rule(&filterRules, "KUBE-EXTERNAL-SERVICES", "-m comment --comment", quote(pi.comment+" has no local endpoints"), match(a.String(), p.Port), "-j DROP")
				}
			}
			if p.NodePort != 0 {
				if pi.usesExternal {
					rule(&nodeportsRules, "KUBE-NODEPORTS", "-m comment --comment", pi.comment, fmt.Sprintf("-m %s -p %s --dport %d", proto, proto, p.NodePort), "-j", pi.extChain)
				} else {
					rule(&filterRules, "KUBE-EXTERNAL-SERVICES", "-m comment --comment", quote(pi.comment+" has no local endpoints"),
						fmt.Sprintf("-m addrtype --dst-type LOCAL -m %s -p %s --dport %d -j DROP", proto, proto, p.NodePort))
				}
			}
			if !write {
				continue
			}
			// Per-Service chains.
			if pi.clusterEndpoints {
				natChains = append(natChains, pi.svcChain)
				for _, a := range svc.ClusterIPs {
					rule(&natRules, pi.svcChain, "-m comment --comment", quote(pi.comment+" cluster IP"), match(a.String(), p.Port), "! -s", clusterCIDRs, "-j KUBE-MARK-MASQ")
				}
				k.endpointRules(rule, &natRules, pi, pi.svcChain, pi.cluster)
			}
			if pi.usesExternal {
				natChains = append(natChains, pi.extChain)
				if len(svc.SourceRanges) > 0 && len(svc.LoadBalancerIPs) > 0 {
					natChains = append(natChains, pi.fwChain)
					for _, r := range svc.SourceRanges {
						rule(&natRules, pi.fwChain, "-m comment --comment", quote(pi.comment+" loadbalancer IP"), "-s", r.String(), "-j", pi.extChain)
					}
					rule(&natRules, pi.fwChain, "-m comment --comment", quote("other traffic to "+pi.comment+" will be dropped by KUBE-PROXY-FIREWALL"))
				}
				if !svc.ExternalPolicyLocal {
					rule(&natRules, pi.extChain, "-m comment --comment", quote("masquerade traffic for "+pi.comment+" external destinations"), "-j KUBE-MARK-MASQ")
					rule(&natRules, pi.extChain, "-j", pi.svcChain)
				} else {
					rule(&natRules, pi.extChain, "-m comment --comment", quote("pod traffic for "+pi.comment+" external destinations"), "-s", clusterCIDRs, "-j", pi.svcChain)
					rule(&natRules, pi.extChain, "-m comment --comment", quote("masquerade LOCAL traffic for "+pi.comment+" external destinations"), "-m addrtype --src-type LOCAL -j KUBE-MARK-MASQ")
					rule(&natRules, pi.extChain, "-m comment --comment", quote("route LOCAL traffic for "+pi.comment+" external destinations"), "-m addrtype --src-type LOCAL -j", pi.svcChain)
					rule(&natRules, pi.extChain, "-j", pi.localChain)
				}
			}
			if pi.usesLocal {
				natChains = append(natChains, pi.localChain)
				k.endpointRules(rule, &natRules, pi, pi.localChain, pi.local)
			}
			// Endpoint chains, once per endpoint.
			seen := map[string]bool{}
			for _, e := range slices.Concat(pi.cluster, pi.local) {
				ep := e.AddrPort().String()
				chain := endpointChain(pi.name, ep)
				if seen[chain] {
					continue
				}
				seen[chain] = true
				natChains = append(natChains, chain)
				comment := k.endpointComment(pi.comment)
				rule(&natRules, chain, comment, "-s", e.Address.String(), "-j KUBE-MARK-MASQ")
				if svc.AffinityTimeout > 0 {
					rule(&natRules, chain, comment, "-m recent --name", chain, "--set",
						fmt.Sprintf("-m %s -p %s -j DNAT --to-destination %s", proto, proto, ep))
				} else {
					rule(&natRules, chain, comment, fmt.Sprintf("-m %s -p %s -j DNAT --to-destination %s", proto, proto, ep))
				}
			}
		}
	}
	rule(&svcsRules, "KUBE-SERVICES", "-m comment --comment", quote("kubernetes service nodeports; NOTE: this must be the last rule in this chain"), "-m addrtype --dst-type LOCAL -j KUBE-NODEPORTS")
	rule(&natRules, "KUBE-POSTROUTING", "-m mark ! --mark 0x4000/0x4000 -j RETURN")
	rule(&natRules, "KUBE-POSTROUTING", "-j MARK --xor-mark 0x4000")
	rule(&natRules, "KUBE-POSTROUTING", "-m comment --comment", quote("kubernetes service traffic requiring SNAT"), "-j MASQUERADE --random-fully")
	rule(&natRules, "KUBE-MARK-MASQ", "-j MARK --or-mark 0x4000")
	rule(&filterRules, "KUBE-FORWARD", "-m conntrack --ctstate INVALID -j DROP")
	rule(&filterRules, "KUBE-FORWARD", "-m comment --comment", quote("kubernetes forwarding rules"), "-m mark --mark 0x4000/0x4000 -j ACCEPT")
	rule(&filterRules, "KUBE-FORWARD", "-m comment --comment", quote("kubernetes forwarding conntrack rule"), "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT")

	out := &bytes.Buffer{}
	out.Grow(filterRules.Len() + natRules.Len() + svcsRules.Len() + nodeportsRules.Len() + 64*len(natChains))
	out.WriteString("*filter\n")
	for _, c := range filterChains {
		out.WriteString(":" + c + " - [0:0]\n")
	}
	out.Write(filterRules.Bytes())
	out.WriteString("COMMIT\n*nat\n")
	// A stale chain is declared too, which flushes it, as it must be empty to go.
	for _, c := range slices.Concat(natChains, stale) {
		out.WriteString(":" + c + " - [0:0]\n")
	}
	out.Write(svcsRules.Bytes())
	out.Write(nodeportsRules.Bytes())
	out.Write(natRules.Bytes())
	for _, c := range stale {
		out.WriteString("-X " + c + "\n")
	}
	out.WriteString("COMMIT\n")
	return restoreText{buf: out, rules: rules, chains: len(filterChains) + len(natChains)}
}

// endpointRules writes the rules of a KUBE-SVC or KUBE-SVL chain: with session
// affinity, a `-m recent --rcheck` rule per endpoint first; then one rule per
// endpoint, the n-th of the remaining m taken with probability 1/m, the last
// unconditionally.
func (k *kubeProxy) endpointRules(rule func(*bytes.Buffer, ...string), b *bytes.Buffer, pi *portInfo, chain string, eps []state.Endpoint) {
	if pi.svc.AffinityTimeout > 0 {
		secs := strconv.Itoa(affinitySeconds(pi.svc.AffinityTimeout))
		for _, e := range eps {
			ep := e.AddrPort().String()
			sep := endpointChain(pi.name, ep)
			rule(b, chain, k.endpointComment(`"`+pi.comment+" -> "+ep+`"`), "-m recent --name", sep, "--rcheck --seconds", secs, "--reap -j", sep)
		}
	}
	for i, e := range eps {
		ep := e.AddrPort().String()
		sep := endpointChain(pi.name, ep)
		if left := len(eps) - i; left > 1 {
			rule(b, chain, k.endpointComment(`"`+pi.comment+" -> "+ep+`"`), fmt.Sprintf("-m statistic --mode random --probability %0.10f", 1/float64(left)), "-j", sep)
		} else {
			rule(b, chain, k.endpointComment(`"`+pi.comment+" -> "+ep+`"`), "-j", sep)
		}
	}
}

// endpointComment returns the comment match of a per-endpoint rule, or nothing in
// large-cluster mode.
func (k *kubeProxy) endpointComment(text string) string {
	if k.largeCluster {
		return ""
	}
	return "-m comment --comment " + text
}
