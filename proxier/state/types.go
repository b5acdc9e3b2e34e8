// Package state turns Kubernetes Services, EndpointSlices, the Node and ServiceCIDRs
// into ClusterState: plain, validated data that the ruleset builder reads. No
// client-go type crosses below this package.
package state

import (
	"fmt"
	"net/netip"
	"time"
)

// Protocol is a transport protocol as nftables spells it.
type Protocol string

// The protocols a Service port may use.
const (
	TCP  Protocol = "tcp"
	UDP  Protocol = "udp"
	SCTP Protocol = "sctp"
)

// ServiceName identifies a Service.
type ServiceName struct {
	Namespace string
	Name      string
}

// String returns "namespace/name".
func (n ServiceName) String() string { return n.Namespace + "/" + n.Name }

// ServicePortName identifies one port of a Service.
type ServicePortName struct {
	ServiceName
	// Port is the port's name ("" for an unnamed single port).
	Port     string
	Protocol Protocol
}

// String returns "namespace/name/protocol/portname".
func (n ServicePortName) String() string {
	return fmt.Sprintf("%s/%s/%s", n.ServiceName, n.Protocol, n.Port)
}

// Node is the node this proxier runs on.
type Node struct {
	Name string
	// Zone is the node's topology.kubernetes.io/zone label.
	Zone string
	// Addresses are the node's own IPs (InternalIP and ExternalIP addresses), both families.
	Addresses []netip.Addr
	// PrimaryIPs holds the node's primary IP of each family it has, as kube-proxy
	// picks its node IPs from the Node: the first InternalIP of the family, else the
	// first ExternalIP.
	PrimaryIPs []netip.Addr
	// PodCIDRs are the node's pod ranges (spec.podCIDRs, host bits cleared): at most
	// one of each family, empty until the node's range is allocated. The NodeCIDR
	// pod-traffic detector reads them.
	PodCIDRs []netip.Prefix
}

// PrimaryIP returns the node's primary IP of the family of IPv6 (is6): the one of
// PrimaryIPs, else the first of Addresses of the family, else the invalid Addr.
func (n Node) PrimaryIP(is6 bool) netip.Addr {
	for _, as := range [][]netip.Addr{n.PrimaryIPs, n.Addresses} {
		for _, a := range as {
			if a.Is6() == is6 {
				return a
			}
		}
	}
	return netip.Addr{}
}

// Service is a Service reduced to what proxying needs. ExternalName Services and
// headless Services are not represented.
type Service struct {
	Name ServiceName
	// Type is ClusterIP, NodePort or LoadBalancer.
	Type string
	// ClusterIPs holds one address per family the Service has.
	ClusterIPs  []netip.Addr
	ExternalIPs []netip.Addr
	// LoadBalancerIPs are the status ingress IPs, excluding those with ipMode Proxy.
	LoadBalancerIPs []netip.Addr
	// SourceRanges are loadBalancerSourceRanges; empty means all sources.
	SourceRanges []netip.Prefix
	// ExternalPolicyLocal is externalTrafficPolicy: Local (only meaningful for
	// Services with external addresses or node ports).
	ExternalPolicyLocal bool
	// InternalPolicyLocal is internalTrafficPolicy: Local.
	InternalPolicyLocal bool
	// AffinityTimeout is the ClientIP session affinity timeout; zero means no affinity.
	AffinityTimeout time.Duration
	// HealthCheckNodePort serves the local endpoint count for ETP Local load balancers.
	HealthCheckNodePort uint16
	Ports               []ServicePort
}

// ServicePort is one port of a Service.
type ServicePort struct {
	Name     string
	Protocol Protocol
	Port     uint16
	// NodePort is zero when the port has none.
	NodePort uint16
}

// PortName returns the ServicePortName of port p of s.
func (s *Service) PortName(p ServicePort) ServicePortName {
	return ServicePortName{ServiceName: s.Name, Port: p.Name, Protocol: p.Protocol}
}

// EndpointSlice is an EndpointSlice reduced to what proxying needs.
type EndpointSlice struct {
	// Name is the slice's own name.
	Name string
	// Service is the Service the slice belongs to (kubernetes.io/service-name label).
	Service ServiceName
	// IPv6 is true for AddressType IPv6 and false for IPv4.
	IPv6      bool
	Ports     []EndpointPort
	Endpoints []SliceEndpoint
}

// EndpointPort is a port of an EndpointSlice.
type EndpointPort struct {
	Name     string
	Protocol Protocol
	Port     uint16
}

// SliceEndpoint is one endpoint of an EndpointSlice, with its conditions resolved
// as the API defines them as kube-proxy reads them (ready and serving default to true, terminating to false).
type SliceEndpoint struct {
	Address     netip.Addr
	Ready       bool
	Serving     bool
	Terminating bool
	NodeName    string
	Zone        string
	// ZoneHints are the zones of hints.forZones; nil when the endpoint has no hints.
	ZoneHints []string
	// NodeHints are the nodes of hints.forNodes (set by the EndpointSlice controller
	// for trafficDistribution PreferSameNode); nil when the endpoint has none.
	NodeHints []string
}

// Endpoint is one backend of one Service port.
type Endpoint struct {
	Address     netip.Addr
	Port        uint16
	Ready       bool
	Serving     bool
	Terminating bool
	NodeName    string
	Zone        string
	ZoneHints   []string
	NodeHints   []string
}

// AddrPort returns the endpoint's address and port.
func (e Endpoint) AddrPort() netip.AddrPort { return netip.AddrPortFrom(e.Address, e.Port) }

// ClusterState is everything the ruleset builder needs: this node, every Service,
// every EndpointSlice and the service ranges, already validated.
type ClusterState struct {
	Node     Node
	Services map[ServiceName]*Service
	// Slices holds the EndpointSlices of each Service, by slice name.
	Slices map[ServiceName]map[string]*EndpointSlice
	// ServiceCIDRs are the ranges of every ServiceCIDR object (networking.k8s.io/v1),
	// both families, sorted and without duplicates: where ClusterIPs are allocated.
	// The ruleset drops traffic to the addresses of these ranges, and of the
	// configured serviceCIDR, that no Service holds.
	ServiceCIDRs []netip.Prefix
}

// NewClusterState returns an empty ClusterState.
func NewClusterState() *ClusterState {
	return &ClusterState{
		Services: map[ServiceName]*Service{},
		Slices:   map[ServiceName]map[string]*EndpointSlice{},
	}
}
