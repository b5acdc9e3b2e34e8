package state

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// LabelServiceProxyName is the label by which a Service asks to be proxied by some
// other proxy, whatever the label's value. As kube-proxy does (its Service informer
// selects only Services without it), a Service carrying it is not proxied at all.
// EndpointSlices are not filtered by it, as kube-proxy's EndpointSlice informer is
// not: the Service decides.
const LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"

// DefaultAffinityTimeout is the ClientIP session affinity timeout of a Service that
// does not set one.
const DefaultAffinityTimeout = time.Duration(v1.DefaultClientIPServiceAffinitySeconds) * time.Second

// maxAffinitySeconds is the largest timeout the API accepts (one day).
const maxAffinitySeconds = 86400

// Service types as Service.Type holds them.
const (
	TypeClusterIP    = string(v1.ServiceTypeClusterIP)
	TypeNodePort     = string(v1.ServiceTypeNodePort)
	TypeLoadBalancer = string(v1.ServiceTypeLoadBalancer)
)

// ConvertService validates svc and reduces it to a Service. It returns (nil, nil) for
// a Service that is not proxied: ExternalName, headless (clusterIP "None"), without
// an allocated cluster IP, or labelled for another proxy. A malformed Service yields
// an *ObjectError listing every invalid field.
func ConvertService(svc *v1.Service) (*Service, error) {
	if svc == nil || svc.Spec.Type == v1.ServiceTypeExternalName {
		return nil, nil
	}
	if _, ok := svc.Labels[LabelServiceProxyName]; ok {
		return nil, nil
	}
	ips, ipsPath := svc.Spec.ClusterIPs, "spec.clusterIPs"
	if len(ips) == 0 {
		ips, ipsPath = nil, "spec.clusterIP"
		if svc.Spec.ClusterIP != "" {
			ips = []string{svc.Spec.ClusterIP}
		}
	}
	// kube-proxy skips a Service without a cluster IP, headless or not yet allocated,
	// whatever its type.
	if len(ips) == 0 || ips[0] == v1.ClusterIPNone || ips[0] == "" {
		return nil, nil
	}

	var fe fieldErrors
	checkObjectName(&fe, svc.Namespace, svc.Name)
	out := &Service{Name: ServiceName{Namespace: svc.Namespace, Name: svc.Name}}

	switch t := svc.Spec.Type; t {
	case "", v1.ServiceTypeClusterIP:
		out.Type = TypeClusterIP
	case v1.ServiceTypeNodePort, v1.ServiceTypeLoadBalancer:
		out.Type = string(t)
	default:
		fe.add("spec.type", fmt.Errorf("unsupported type %q", t))
	}

	if svc.Spec.ClusterIP != "" && len(svc.Spec.ClusterIPs) > 0 && svc.Spec.ClusterIP != svc.Spec.ClusterIPs[0] {
		fe.add("spec.clusterIP", fmt.Errorf("%q differs from spec.clusterIPs[0] %q", svc.Spec.ClusterIP, svc.Spec.ClusterIPs[0]))
	}
	if len(ips) > 2 {
		fe.add(ipsPath, fmt.Errorf("%d addresses, at most one per family is allowed", len(ips)))
	}
	for i, s := range ips {
		path := ipsPath
		if ipsPath == "spec.clusterIPs" {
			path = fmt.Sprintf("%s[%d]", ipsPath, i)
		}
		ip, err := parseIP(s)
		if err != nil {
			fe.add(path, err)
			continue
		}
		if len(out.ClusterIPs) == 1 && out.ClusterIPs[0].Is4() == ip.Is4() {
			fe.add(path, fmt.Errorf("%s is of the same family as %s[0]", ip, ipsPath))
			continue
		}
		out.ClusterIPs = append(out.ClusterIPs, ip)
	}

	convertServicePorts(&fe, svc, out)

	for i, s := range svc.Spec.ExternalIPs {
		ip, err := parseIP(s)
		if err != nil {
			fe.add(fmt.Sprintf("spec.externalIPs[%d]", i), err)
			continue
		}
		if !slices.Contains(out.ExternalIPs, ip) {
			out.ExternalIPs = append(out.ExternalIPs, ip)
		}
	}

	if out.Type == TypeLoadBalancer {
		for i, ing := range svc.Status.LoadBalancer.Ingress {
			path := fmt.Sprintf("status.loadBalancer.ingress[%d]", i)
			if ing.IPMode != nil {
				switch *ing.IPMode {
				case v1.LoadBalancerIPModeVIP:
				case v1.LoadBalancerIPModeProxy:
					// The load balancer delivers the traffic itself, with its own
					// address as destination: it is not ours to DNAT.
					continue
				default:
					fe.add(path+".ipMode", fmt.Errorf("unsupported mode %q", *ing.IPMode))
					continue
				}
			}
			if ing.IP == "" { // hostname-only ingress
				continue
			}
			ip, err := parseIP(ing.IP)
			if err != nil {
				fe.add(path+".ip", err)
				continue
			}
			if !slices.Contains(out.LoadBalancerIPs, ip) {
				out.LoadBalancerIPs = append(out.LoadBalancerIPs, ip)
			}
		}
	}

	for i, s := range svc.Spec.LoadBalancerSourceRanges {
		p, err := parseSourceRange(s)
		if err != nil {
			fe.add(fmt.Sprintf("spec.loadBalancerSourceRanges[%d]", i), err)
			continue
		}
		// Source ranges only restrict load balancer traffic.
		if out.Type == TypeLoadBalancer && !slices.Contains(out.SourceRanges, p) {
			out.SourceRanges = append(out.SourceRanges, p)
		}
	}

	switch p := svc.Spec.ExternalTrafficPolicy; p {
	case "", v1.ServiceExternalTrafficPolicyCluster:
	case v1.ServiceExternalTrafficPolicyLocal:
		out.ExternalPolicyLocal = out.Type == TypeNodePort || out.Type == TypeLoadBalancer || len(out.ExternalIPs) > 0
	default:
		fe.add("spec.externalTrafficPolicy", fmt.Errorf("unsupported policy %q", p))
	}
	if p := svc.Spec.InternalTrafficPolicy; p != nil {
		switch *p {
		case "", v1.ServiceInternalTrafficPolicyCluster:
		case v1.ServiceInternalTrafficPolicyLocal:
			out.InternalPolicyLocal = true
		default:
			fe.add("spec.internalTrafficPolicy", fmt.Errorf("unsupported policy %q", *p))
		}
	}

	switch a := svc.Spec.SessionAffinity; a {
	case "", v1.ServiceAffinityNone:
	case v1.ServiceAffinityClientIP:
		secs := v1.DefaultClientIPServiceAffinitySeconds
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			secs = *c.ClientIP.TimeoutSeconds
		}
		if secs < 1 || secs > maxAffinitySeconds {
			fe.add("spec.sessionAffinityConfig.clientIP.timeoutSeconds",
				fmt.Errorf("timeout %d out of range 1-%d", secs, maxAffinitySeconds))
		} else {
			out.AffinityTimeout = time.Duration(secs) * time.Second
		}
	default:
		fe.add("spec.sessionAffinity", fmt.Errorf("unsupported affinity %q", a))
	}

	if hc := svc.Spec.HealthCheckNodePort; hc != 0 {
		if hc < 1 || hc > 65535 {
			fe.add("spec.healthCheckNodePort", fmt.Errorf("port %d out of range 1-65535", hc))
		} else if out.Type == TypeLoadBalancer && out.ExternalPolicyLocal {
			// As kube-proxy, serve health checks only where a load balancer uses them.
			out.HealthCheckNodePort = uint16(hc)
		}
	}

	if err := fe.objectError(KindService, svc.Namespace, svc.Name); err != nil {
		return nil, err
	}
	return out, nil
}

// convertServicePorts validates the ports of svc and appends them to out.Ports.
func convertServicePorts(fe *fieldErrors, svc *v1.Service, out *Service) {
	type protoPort struct {
		proto Protocol
		port  int32
	}
	names := map[string]int{}
	ports := map[protoPort]int{}
	nodePorts := map[protoPort]int{}
	for i, p := range svc.Spec.Ports {
		path := fmt.Sprintf("spec.ports[%d]", i)
		ok := true
		proto, err := parseProtocol(p.Protocol)
		if err != nil {
			fe.add(path+".protocol", err)
			ok = false
		}
		if len(svc.Spec.Ports) > 1 && p.Name == "" {
			fe.addMsg(path+".name", "required when the Service has more than one port")
			ok = false
		} else if j, dup := names[p.Name]; dup {
			fe.add(path+".name", fmt.Errorf("duplicate port name %q (also spec.ports[%d])", p.Name, j))
			ok = false
		} else {
			names[p.Name] = i
		}
		if err := checkPort(p.Port); err != nil {
			fe.add(path+".port", err)
			ok = false
		} else if j, dup := ports[protoPort{proto, p.Port}]; dup && proto != "" {
			fe.add(path, fmt.Errorf("duplicate port %d/%s (also spec.ports[%d])", p.Port, proto, j))
			ok = false
		} else {
			ports[protoPort{proto, p.Port}] = i
		}
		if p.NodePort != 0 {
			if err := checkPort(p.NodePort); err != nil {
				fe.add(path+".nodePort", err)
				ok = false
			} else if out.Type == TypeClusterIP {
				fe.addMsg(path+".nodePort", "not allowed for type ClusterIP")
				ok = false
			} else if j, dup := nodePorts[protoPort{proto, p.NodePort}]; dup && proto != "" {
				fe.add(path+".nodePort", fmt.Errorf("duplicate node port %d/%s (also spec.ports[%d])", p.NodePort, proto, j))
				ok = false
			} else {
				nodePorts[protoPort{proto, p.NodePort}] = i
			}
		}
		if ok {
			out.Ports = append(out.Ports, ServicePort{
				Name: p.Name, Protocol: proto, Port: uint16(p.Port), NodePort: uint16(p.NodePort),
			})
		}
	}
}

// ConvertEndpointSlice validates s and reduces it to an EndpointSlice. It returns
// (nil, nil) for a slice that is not proxied: AddressType FQDN, or labelled as a
// headless Service's (service.kubernetes.io/headless, kube-proxy's EndpointSlice
// informer selector). Only the first address of each endpoint
// is used, as kube-proxy does. Ports without a port number are skipped. A malformed
// slice yields an *ObjectError listing every invalid field.
func ConvertEndpointSlice(s *discoveryv1.EndpointSlice) (*EndpointSlice, error) {
	if s == nil || s.AddressType == discoveryv1.AddressTypeFQDN {
		return nil, nil
	}
	if _, ok := s.Labels[v1.IsHeadlessService]; ok {
		return nil, nil
	}
	var fe fieldErrors
	checkObjectName(&fe, s.Namespace, s.Name)
	out := &EndpointSlice{Name: s.Name}
	switch s.AddressType {
	case discoveryv1.AddressTypeIPv4:
	case discoveryv1.AddressTypeIPv6:
		out.IPv6 = true
	default:
		fe.add("addressType", fmt.Errorf("unsupported address type %q", s.AddressType))
	}
	svcName := s.Labels[discoveryv1.LabelServiceName]
	if svcName == "" {
		fe.addMsg("metadata.labels["+discoveryv1.LabelServiceName+"]", "required: names the slice's Service")
	}
	out.Service = ServiceName{Namespace: s.Namespace, Name: svcName}

	names := map[string]int{}
	for i, p := range s.Ports {
		if p.Port == nil {
			continue
		}
		path := fmt.Sprintf("ports[%d]", i)
		ok := true
		var proto Protocol
		if p.Protocol == nil {
			proto = TCP
		} else {
			var err error
			if proto, err = parseProtocol(*p.Protocol); err != nil {
				fe.add(path+".protocol", err)
				ok = false
			}
		}
		name := ""
		if p.Name != nil {
			name = *p.Name
		}
		if j, dup := names[name]; dup {
			fe.add(path+".name", fmt.Errorf("duplicate port name %q (also ports[%d])", name, j))
			ok = false
		}
		names[name] = i
		if err := checkPort(*p.Port); err != nil {
			fe.add(path+".port", err)
			ok = false
		}
		if ok {
			out.Ports = append(out.Ports, EndpointPort{Name: name, Protocol: proto, Port: uint16(*p.Port)})
		}
	}

	for i, e := range s.Endpoints {
		path := fmt.Sprintf("endpoints[%d]", i)
		if len(e.Addresses) == 0 {
			fe.addMsg(path+".addresses", "required: at least one address")
			continue
		}
		addr, err := parseIP(e.Addresses[0])
		if err != nil {
			fe.add(path+".addresses[0]", err)
			continue
		}
		if addr.Is6() != out.IPv6 {
			fe.add(path+".addresses[0]", fmt.Errorf("%s does not match addressType %s", addr, s.AddressType))
			continue
		}
		ep := SliceEndpoint{Address: addr}
		ep.Ready, ep.Serving, ep.Terminating = resolveConditions(e.Conditions)
		if e.NodeName != nil {
			ep.NodeName = *e.NodeName
		}
		if e.Zone != nil {
			ep.Zone = *e.Zone
		}
		if e.Hints != nil {
			for j, z := range e.Hints.ForZones {
				if z.Name == "" {
					fe.addMsg(fmt.Sprintf("%s.hints.forZones[%d].name", path, j), "required")
					continue
				}
				ep.ZoneHints = append(ep.ZoneHints, z.Name)
			}
			for j, n := range e.Hints.ForNodes {
				if n.Name == "" {
					fe.addMsg(fmt.Sprintf("%s.hints.forNodes[%d].name", path, j), "required")
					continue
				}
				ep.NodeHints = append(ep.NodeHints, n.Name)
			}
		}
		out.Endpoints = append(out.Endpoints, ep)
	}

	if err := fe.objectError(KindEndpointSlice, s.Namespace, s.Name); err != nil {
		return nil, err
	}
	return out, nil
}

// resolveConditions applies the defaults of nil conditions: ready is true, serving
// is ready, terminating is false.
func resolveConditions(c discoveryv1.EndpointConditions) (ready, serving, terminating bool) {
	// As kube-proxy reads them: unset ready and serving both mean true.
	ready = c.Ready == nil || *c.Ready
	serving = c.Serving == nil || *c.Serving
	terminating = c.Terminating != nil && *c.Terminating
	return ready, serving, terminating
}

// ConvertNode validates n and reduces it to a Node: its name, its
// topology.kubernetes.io/zone label, its InternalIP and ExternalIP addresses
// (deduplicated, in the order listed), its primary IP of each family (IPv4 first)
// and its spec.podCIDRs. A malformed Node yields a Node holding only its name and an
// *ObjectError listing every invalid field.
func ConvertNode(n *v1.Node) (Node, error) {
	if n == nil {
		return Node{}, nil
	}
	var fe fieldErrors
	if n.Name == "" {
		fe.addMsg("metadata.name", "required")
	}
	out := Node{Name: n.Name, Zone: n.Labels[v1.LabelTopologyZone]}
	// primary holds the first InternalIP and the first ExternalIP of each family.
	var primary [2][2]netip.Addr // [external][ipv6]
	for i, a := range n.Status.Addresses {
		if a.Type != v1.NodeInternalIP && a.Type != v1.NodeExternalIP {
			continue
		}
		ip, err := parseIP(a.Address)
		if err != nil {
			fe.add(fmt.Sprintf("status.addresses[%d].address", i), err)
			continue
		}
		if !slices.Contains(out.Addresses, ip) {
			out.Addresses = append(out.Addresses, ip)
		}
		ext, v6 := b2i(a.Type == v1.NodeExternalIP), b2i(ip.Is6())
		if !primary[ext][v6].IsValid() {
			primary[ext][v6] = ip
		}
	}
	for v6 := range 2 {
		if ip := cmp.Or(primary[0][v6], primary[1][v6]); ip.IsValid() {
			out.PrimaryIPs = append(out.PrimaryIPs, ip)
		}
	}
	for i, c := range n.Spec.PodCIDRs {
		p, err := netip.ParsePrefix(c)
		if err != nil || p.Addr().Is4In6() {
			fe.addMsg(fmt.Sprintf("spec.podCIDRs[%d]", i), fmt.Sprintf("invalid CIDR %q", c))
			continue
		}
		out.PodCIDRs = append(out.PodCIDRs, p.Masked())
	}
	if err := fe.objectError(KindNode, "", n.Name); err != nil {
		return Node{Name: n.Name}, err
	}
	return out, nil
}

// b2i returns 1 for true and 0 for false.
func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// checkObjectName records a missing namespace or name.
func checkObjectName(fe *fieldErrors, namespace, name string) {
	if namespace == "" {
		fe.addMsg("metadata.namespace", "required")
	}
	if name == "" {
		fe.addMsg("metadata.name", "required")
	}
}

// parseIP parses an IP address as the API spells it. Zones and IPv4-mapped IPv6
// addresses are refused: nftables would not match them as the user meant.
func parseIP(s string) (netip.Addr, error) {
	ip, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("invalid IP address: %w", err)
	}
	if ip.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("invalid IP address %q: zones are not allowed", s)
	}
	if ip.Is4In6() {
		return netip.Addr{}, fmt.Errorf("invalid IP address %q: IPv4-mapped IPv6 addresses are not allowed", s)
	}
	return ip, nil
}

// parseSourceRange parses a loadBalancerSourceRanges entry: a CIDR, or a bare IP
// taken as a /32 or /128. Spaces around it are ignored, as kube-proxy does, and
// host bits are cleared.
func parseSourceRange(s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	if !strings.Contains(s, "/") {
		ip, err := parseIP(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("invalid CIDR %q: %w", s, err)
		}
		return netip.PrefixFrom(ip, ip.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("invalid CIDR: %w", err)
	}
	if p.Addr().Is4In6() {
		return netip.Prefix{}, fmt.Errorf("invalid CIDR %q: IPv4-mapped IPv6 addresses are not allowed", s)
	}
	return p.Masked(), nil
}

// errProtocol is wrapped by the error for a protocol nftproxy cannot proxy.
var errProtocol = errors.New("unsupported protocol")

// parseProtocol maps a Kubernetes protocol to ours; "" is TCP, the API default.
func parseProtocol(p v1.Protocol) (Protocol, error) {
	switch p {
	case "", v1.ProtocolTCP:
		return TCP, nil
	case v1.ProtocolUDP:
		return UDP, nil
	case v1.ProtocolSCTP:
		return SCTP, nil
	}
	return "", fmt.Errorf("%w %q", errProtocol, p)
}

// checkPort reports a port number outside 1-65535.
func checkPort(p int32) error {
	if p < 1 || p > 65535 {
		return fmt.Errorf("port %d out of range 1-65535", p)
	}
	return nil
}
