package state

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// cmpNet lets cmp compare netip values, whose fields are unexported.
var cmpNet = cmp.Options{
	cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
	cmp.Comparer(func(a, b netip.Prefix) bool { return a == b }),
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func ptr[T any](v T) *T { return &v }

// testService returns default/web, a one-port ClusterIP Service, changed by mods.
func testService(mods ...func(*v1.Service)) *v1.Service {
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeClusterIP,
			ClusterIP:  "172.30.0.10",
			ClusterIPs: []string{"172.30.0.10"},
			Ports:      []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80}},
		},
	}
	for _, m := range mods {
		m(s)
	}
	return s
}

// wantService is what testService converts to, changed by mods.
func wantService(mods ...func(*Service)) *Service {
	s := &Service{
		Name:       ServiceName{Namespace: "default", Name: "web"},
		Type:       TypeClusterIP,
		ClusterIPs: addrs("172.30.0.10"),
		Ports:      []ServicePort{{Name: "http", Protocol: TCP, Port: 80}},
	}
	for _, m := range mods {
		m(s)
	}
	return s
}

func TestConvertService(t *testing.T) {
	lb := func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		s.Spec.Ports[0].NodePort = 30080
	}
	wantLB := func(s *Service) {
		s.Type = TypeLoadBalancer
		s.Ports[0].NodePort = 30080
	}
	tests := []struct {
		name string
		svc  *v1.Service
		want *Service // nil: not proxied
	}{
		{"cluster IP", testService(), wantService()},
		{"type defaults to ClusterIP", testService(func(s *v1.Service) { s.Spec.Type = "" }), wantService()},
		{"clusterIP without clusterIPs", testService(func(s *v1.Service) { s.Spec.ClusterIPs = nil }), wantService()},
		{
			"dual-stack",
			testService(func(s *v1.Service) { s.Spec.ClusterIPs = []string{"172.30.0.10", "fd00:30::10"} }),
			wantService(func(s *Service) { s.ClusterIPs = addrs("172.30.0.10", "fd00:30::10") }),
		},
		{
			"IPv6 primary",
			testService(func(s *v1.Service) {
				s.Spec.ClusterIP = "fd00:30::10"
				s.Spec.ClusterIPs = []string{"fd00:30::10", "172.30.0.10"}
			}),
			wantService(func(s *Service) { s.ClusterIPs = addrs("fd00:30::10", "172.30.0.10") }),
		},
		{"headless", testService(func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "None", []string{"None"} }), nil},
		{"headless by clusterIP only", testService(func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "None", nil }), nil},
		{"no cluster IP yet", testService(func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "", nil }), nil},
		{
			"ExternalName",
			testService(func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeExternalName
				s.Spec.ExternalName = "example.com"
				s.Spec.ClusterIP, s.Spec.ClusterIPs = "", nil
			}),
			nil,
		},
		{
			"headless with invalid ports is not an error",
			testService(func(s *v1.Service) {
				s.Spec.ClusterIP, s.Spec.ClusterIPs = "None", []string{"None"}
				s.Spec.Ports[0].Protocol = "TCPX"
			}),
			nil,
		},
		{
			"for another proxy",
			testService(func(s *v1.Service) { s.Labels = map[string]string{LabelServiceProxyName: "other"} }),
			nil,
		},
		{
			"ports and protocols",
			testService(func(s *v1.Service) {
				s.Spec.Ports = []v1.ServicePort{
					{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53},
					{Name: "dns-tcp", Protocol: v1.ProtocolTCP, Port: 53},
					{Name: "sig", Protocol: v1.ProtocolSCTP, Port: 9000},
					{Name: "default-tcp", Port: 65535},
				}
			}),
			wantService(func(s *Service) {
				s.Ports = []ServicePort{
					{Name: "dns", Protocol: UDP, Port: 53},
					{Name: "dns-tcp", Protocol: TCP, Port: 53},
					{Name: "sig", Protocol: SCTP, Port: 9000},
					{Name: "default-tcp", Protocol: TCP, Port: 65535},
				}
			}),
		},
		{
			"unnamed single port",
			testService(func(s *v1.Service) { s.Spec.Ports[0].Name = "" }),
			wantService(func(s *Service) { s.Ports[0].Name = "" }),
		},
		{
			"node port",
			testService(func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeNodePort
				s.Spec.Ports[0].NodePort = 30080
			}),
			wantService(func(s *Service) {
				s.Type = TypeNodePort
				s.Ports[0].NodePort = 30080
			}),
		},
		{
			"external IPs, deduplicated",
			testService(func(s *v1.Service) { s.Spec.ExternalIPs = []string{"192.168.0.100", "2001:db8::1", "192.168.0.100"} }),
			wantService(func(s *Service) { s.ExternalIPs = addrs("192.168.0.100", "2001:db8::1") }),
		},
		{
			"load balancer IPs, ipMode Proxy and hostnames excluded",
			testService(lb, func(s *v1.Service) {
				s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{
					{IP: "192.0.2.1"},
					{IP: "192.0.2.2", IPMode: ptr(v1.LoadBalancerIPModeVIP)},
					{IP: "192.0.2.3", IPMode: ptr(v1.LoadBalancerIPModeProxy)},
					{Hostname: "lb.example.com"},
					{IP: "2001:db8::2"},
				}
			}),
			wantService(wantLB, func(s *Service) { s.LoadBalancerIPs = addrs("192.0.2.1", "192.0.2.2", "2001:db8::2") }),
		},
		{
			"load balancer status ignored unless type LoadBalancer",
			testService(func(s *v1.Service) {
				s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "192.0.2.1"}}
			}),
			wantService(),
		},
		{
			"source ranges: CIDRs, bare IPs, host bits cleared, spaces trimmed",
			testService(lb, func(s *v1.Service) {
				s.Spec.LoadBalancerSourceRanges = []string{"203.0.113.0/24", "198.51.100.7", " 10.1.2.3/8 ", "2001:db8::5", "2001:db8:1::/48"}
			}),
			wantService(wantLB, func(s *Service) {
				s.SourceRanges = prefixes("203.0.113.0/24", "198.51.100.7/32", "10.0.0.0/8", "2001:db8::5/128", "2001:db8:1::/48")
			}),
		},
		{
			"source ranges only for LoadBalancer",
			testService(func(s *v1.Service) { s.Spec.LoadBalancerSourceRanges = []string{"203.0.113.0/24"} }),
			wantService(),
		},
		{
			"externalTrafficPolicy Local on a LoadBalancer, with health check port",
			testService(lb, func(s *v1.Service) {
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
				s.Spec.HealthCheckNodePort = 32000
			}),
			wantService(wantLB, func(s *Service) {
				s.ExternalPolicyLocal = true
				s.HealthCheckNodePort = 32000
			}),
		},
		{
			"externalTrafficPolicy Local on a NodePort: no health check port",
			testService(func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeNodePort
				s.Spec.Ports[0].NodePort = 30080
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
				s.Spec.HealthCheckNodePort = 32000
			}),
			wantService(func(s *Service) {
				s.Type = TypeNodePort
				s.Ports[0].NodePort = 30080
				s.ExternalPolicyLocal = true
			}),
		},
		{
			"externalTrafficPolicy Local with external IPs",
			testService(func(s *v1.Service) {
				s.Spec.ExternalIPs = []string{"192.168.0.100"}
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			}),
			wantService(func(s *Service) {
				s.ExternalIPs = addrs("192.168.0.100")
				s.ExternalPolicyLocal = true
			}),
		},
		{
			"externalTrafficPolicy Local meaningless on a ClusterIP",
			testService(func(s *v1.Service) { s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal }),
			wantService(),
		},
		{
			"externalTrafficPolicy Cluster",
			testService(lb, func(s *v1.Service) { s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyCluster }),
			wantService(wantLB),
		},
		{
			"internalTrafficPolicy Local",
			testService(func(s *v1.Service) { s.Spec.InternalTrafficPolicy = ptr(v1.ServiceInternalTrafficPolicyLocal) }),
			wantService(func(s *Service) { s.InternalPolicyLocal = true }),
		},
		{
			"internalTrafficPolicy Cluster",
			testService(func(s *v1.Service) { s.Spec.InternalTrafficPolicy = ptr(v1.ServiceInternalTrafficPolicyCluster) }),
			wantService(),
		},
		{
			"session affinity with default timeout",
			testService(func(s *v1.Service) { s.Spec.SessionAffinity = v1.ServiceAffinityClientIP }),
			wantService(func(s *Service) { s.AffinityTimeout = 10800 * time.Second }),
		},
		{
			"session affinity with timeout",
			testService(func(s *v1.Service) {
				s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
				s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr[int32](600)}}
			}),
			wantService(func(s *Service) { s.AffinityTimeout = 10 * time.Minute }),
		},
		{
			"session affinity None ignores the config",
			testService(func(s *v1.Service) {
				s.Spec.SessionAffinity = v1.ServiceAffinityNone
				s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr[int32](600)}}
			}),
			wantService(),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ConvertService(tt.svc)
			if err != nil {
				t.Fatalf("ConvertService: %v", err)
			}
			if diff := cmp.Diff(tt.want, got, cmpNet); diff != "" {
				t.Errorf("ConvertService (-want +got):\n%s", diff)
			}
		})
	}
}

// checkObjectError asserts that err is an *ObjectError of the object with exactly
// the given field paths, and that its message names the object and each field.
func checkObjectError(t *testing.T, err error, kind, namespace, name string, fields ...string) {
	t.Helper()
	var oe *ObjectError
	if !errors.As(err, &oe) {
		t.Fatalf("error %v (%T) is not an *ObjectError", err, err)
	}
	if oe.Kind != kind || oe.Namespace != namespace || oe.Name != name {
		t.Errorf("error names %s %s/%s, want %s %s/%s", oe.Kind, oe.Namespace, oe.Name, kind, namespace, name)
	}
	if diff := cmp.Diff(fields, oe.Fields); diff != "" {
		t.Errorf("error %q: fields (-want +got):\n%s", err, diff)
	}
	msg := err.Error()
	obj := strings.ToLower(kind) + " " + name
	if namespace != "" {
		obj = strings.ToLower(kind) + " " + namespace + "/" + name
	}
	if !strings.HasPrefix(msg, obj+": ") {
		t.Errorf("error %q does not start with %q", msg, obj+": ")
	}
	for _, f := range fields {
		if !strings.Contains(msg, f+": ") {
			t.Errorf("error %q does not name field %q", msg, f)
		}
	}
	var fe *FieldError
	if len(fields) > 0 && (!errors.As(err, &fe) || fe.Field != fields[0]) {
		t.Errorf("errors.As finds no *FieldError for %q in %v", fields[0], err)
	}
}

func TestConvertServiceErrors(t *testing.T) {
	tests := []struct {
		name   string
		svc    *v1.Service
		fields []string
		msg    string // part of the message
	}{
		{
			"unknown protocol",
			testService(func(s *v1.Service) {
				s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: "x", Protocol: "TCPX", Port: 81})
			}),
			[]string{"spec.ports[1].protocol"},
			`service default/web: spec.ports[1].protocol: unsupported protocol "TCPX"`,
		},
		{"port 0", testService(func(s *v1.Service) { s.Spec.Ports[0].Port = 0 }), []string{"spec.ports[0].port"}, "port 0 out of range"},
		{"port too big", testService(func(s *v1.Service) { s.Spec.Ports[0].Port = 65536 }), []string{"spec.ports[0].port"}, "port 65536 out of range"},
		{
			"node port too big",
			testService(func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeNodePort
				s.Spec.Ports[0].NodePort = 70000
			}),
			[]string{"spec.ports[0].nodePort"}, "port 70000 out of range",
		},
		{"negative node port", testService(func(s *v1.Service) { s.Spec.Ports[0].NodePort = -1 }), []string{"spec.ports[0].nodePort"}, "out of range"},
		{"node port on ClusterIP", testService(func(s *v1.Service) { s.Spec.Ports[0].NodePort = 30080 }), []string{"spec.ports[0].nodePort"}, "not allowed for type ClusterIP"},
		{
			"duplicate port name",
			testService(func(s *v1.Service) {
				s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: "http", Protocol: v1.ProtocolUDP, Port: 81})
			}),
			[]string{"spec.ports[1].name"}, `duplicate port name "http"`,
		},
		{
			"two unnamed ports",
			testService(func(s *v1.Service) {
				s.Spec.Ports = []v1.ServicePort{{Port: 80}, {Port: 81}}
			}),
			[]string{"spec.ports[0].name", "spec.ports[1].name"}, "required when the Service has more than one port",
		},
		{
			"duplicate port and protocol",
			testService(func(s *v1.Service) {
				s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: "http2", Port: 80})
			}),
			[]string{"spec.ports[1]"}, "duplicate port 80/tcp",
		},
		{
			"duplicate node port",
			testService(func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeNodePort
				s.Spec.Ports = []v1.ServicePort{{Name: "a", Port: 80, NodePort: 30080}, {Name: "b", Port: 81, NodePort: 30080}}
			}),
			[]string{"spec.ports[1].nodePort"}, "duplicate node port 30080/tcp",
		},
		{"bad cluster IP", testService(func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "172.30.0.300", []string{"172.30.0.300"} }), []string{"spec.clusterIPs[0]"}, "invalid IP address"},
		{"bad clusterIP field", testService(func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "web", nil }), []string{"spec.clusterIP"}, "invalid IP address"},
		{"bad second cluster IP", testService(func(s *v1.Service) { s.Spec.ClusterIPs = []string{"172.30.0.10", "fd00::zz"} }), []string{"spec.clusterIPs[1]"}, "invalid IP address"},
		{"two IPv4 cluster IPs", testService(func(s *v1.Service) { s.Spec.ClusterIPs = []string{"172.30.0.10", "172.30.0.11"} }), []string{"spec.clusterIPs[1]"}, "same family"},
		{"clusterIP differs from clusterIPs", testService(func(s *v1.Service) { s.Spec.ClusterIP = "172.30.0.11" }), []string{"spec.clusterIP"}, "differs"},
		{"zoned IP", testService(func(s *v1.Service) { s.Spec.ExternalIPs = []string{"fe80::1%eth0"} }), []string{"spec.externalIPs[0]"}, "zones are not allowed"},
		{"IPv4-mapped IP", testService(func(s *v1.Service) { s.Spec.ExternalIPs = []string{"::ffff:192.0.2.1"} }), []string{"spec.externalIPs[0]"}, "IPv4-mapped"},
		{"bad external IP", testService(func(s *v1.Service) { s.Spec.ExternalIPs = []string{"192.168.0.100", "1.2.3"} }), []string{"spec.externalIPs[1]"}, "invalid IP address"},
		{
			"bad load balancer IP",
			testService(func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeLoadBalancer
				s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "192.0.2.1"}, {IP: "lb"}}
			}),
			[]string{"status.loadBalancer.ingress[1].ip"}, "invalid IP address",
		},
		{
			"bad ipMode",
			testService(func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeLoadBalancer
				s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "192.0.2.1", IPMode: ptr(v1.LoadBalancerIPMode("Magic"))}}
			}),
			[]string{"status.loadBalancer.ingress[0].ipMode"}, `unsupported mode "Magic"`,
		},
		{"bad source range", testService(func(s *v1.Service) { s.Spec.LoadBalancerSourceRanges = []string{"10.0.0.0/8", "10.0.0.0/33"} }), []string{"spec.loadBalancerSourceRanges[1]"}, "invalid CIDR"},
		{"bad bare source IP", testService(func(s *v1.Service) { s.Spec.LoadBalancerSourceRanges = []string{"everywhere"} }), []string{"spec.loadBalancerSourceRanges[0]"}, `invalid CIDR "everywhere"`},
		{
			"affinity timeout 0",
			testService(func(s *v1.Service) {
				s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
				s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr[int32](0)}}
			}),
			[]string{"spec.sessionAffinityConfig.clientIP.timeoutSeconds"}, "timeout 0 out of range 1-86400",
		},
		{
			"affinity timeout over a day",
			testService(func(s *v1.Service) {
				s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
				s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr[int32](86401)}}
			}),
			[]string{"spec.sessionAffinityConfig.clientIP.timeoutSeconds"}, "out of range",
		},
		{"unknown affinity", testService(func(s *v1.Service) { s.Spec.SessionAffinity = "Cookie" }), []string{"spec.sessionAffinity"}, `unsupported affinity "Cookie"`},
		{"unknown type", testService(func(s *v1.Service) { s.Spec.Type = "Magic" }), []string{"spec.type"}, `unsupported type "Magic"`},
		{"unknown external policy", testService(func(s *v1.Service) { s.Spec.ExternalTrafficPolicy = "Nearest" }), []string{"spec.externalTrafficPolicy"}, `unsupported policy "Nearest"`},
		{
			"unknown internal policy",
			testService(func(s *v1.Service) { s.Spec.InternalTrafficPolicy = ptr(v1.ServiceInternalTrafficPolicy("Nearest")) }),
			[]string{"spec.internalTrafficPolicy"}, `unsupported policy "Nearest"`,
		},
		{"bad health check port", testService(func(s *v1.Service) { s.Spec.HealthCheckNodePort = 70000 }), []string{"spec.healthCheckNodePort"}, "out of range"},
		{"no namespace", testService(func(s *v1.Service) { s.Namespace = "" }), []string{"metadata.namespace"}, "required"},
		{
			"every error of the object",
			testService(func(s *v1.Service) {
				s.Spec.ExternalIPs = []string{"nope"}
				s.Spec.Ports[0].Protocol = "ICMP"
				s.Spec.SessionAffinity = "Sticky"
			}),
			[]string{"spec.ports[0].protocol", "spec.externalIPs[0]", "spec.sessionAffinity"},
			`service default/web: spec.ports[0].protocol: unsupported protocol "ICMP"; spec.externalIPs[0]: invalid IP address`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ConvertService(tt.svc)
			if got != nil {
				t.Errorf("ConvertService returned %+v with the error", got)
			}
			ns := tt.svc.Namespace
			checkObjectError(t, err, KindService, ns, "web", tt.fields...)
			if err != nil && !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("error %q does not contain %q", err, tt.msg)
			}
		})
	}
}

// testSlice returns default/web-abc, an IPv4 slice of Service web with one ready
// endpoint 10.1.0.5 on node-a and port http 8080, changed by mods.
func testSlice(mods ...func(*discoveryv1.EndpointSlice)) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "default", Name: "web-abc",
			Labels: map[string]string{discoveryv1.LabelServiceName: "web"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Protocol: ptr(v1.ProtocolTCP), Port: ptr[int32](8080)}},
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{"10.1.0.5"},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)},
			NodeName:   ptr("node-a"),
			Zone:       ptr("z1"),
		}},
	}
	for _, m := range mods {
		m(s)
	}
	return s
}

// wantSlice is what testSlice converts to, changed by mods.
func wantSlice(mods ...func(*EndpointSlice)) *EndpointSlice {
	s := &EndpointSlice{
		Name:    "web-abc",
		Service: ServiceName{Namespace: "default", Name: "web"},
		Ports:   []EndpointPort{{Name: "http", Protocol: TCP, Port: 8080}},
		Endpoints: []SliceEndpoint{{
			Address: netip.MustParseAddr("10.1.0.5"), Ready: true, Serving: true,
			NodeName: "node-a", Zone: "z1",
		}},
	}
	for _, m := range mods {
		m(s)
	}
	return s
}

func TestConvertEndpointSlice(t *testing.T) {
	cond := func(ready, serving, terminating *bool) func(*discoveryv1.EndpointSlice) {
		return func(s *discoveryv1.EndpointSlice) {
			s.Endpoints[0].Conditions = discoveryv1.EndpointConditions{Ready: ready, Serving: serving, Terminating: terminating}
		}
	}
	want := func(ready, serving, terminating bool) func(*EndpointSlice) {
		return func(s *EndpointSlice) {
			e := &s.Endpoints[0]
			e.Ready, e.Serving, e.Terminating = ready, serving, terminating
		}
	}
	tests := []struct {
		name  string
		slice *discoveryv1.EndpointSlice
		want  *EndpointSlice
	}{
		{"plain", testSlice(), wantSlice()},
		{"conditions all nil", testSlice(cond(nil, nil, nil)), wantSlice(want(true, true, false))},
		{"not ready, serving nil", testSlice(cond(ptr(false), nil, nil)), wantSlice(want(false, true, false))},
		{"terminating and serving", testSlice(cond(ptr(false), ptr(true), ptr(true))), wantSlice(want(false, true, true))},
		{"terminating, serving nil", testSlice(cond(ptr(false), nil, ptr(true))), wantSlice(want(false, true, true))},
		{"ready, not serving", testSlice(cond(nil, ptr(false), nil)), wantSlice(want(true, false, false))},
		{
			"IPv6",
			testSlice(func(s *discoveryv1.EndpointSlice) {
				s.AddressType = discoveryv1.AddressTypeIPv6
				s.Endpoints[0].Addresses = []string{"fd00:1::5"}
			}),
			wantSlice(func(s *EndpointSlice) {
				s.IPv6 = true
				s.Endpoints[0].Address = netip.MustParseAddr("fd00:1::5")
			}),
		},
		{"FQDN", testSlice(func(s *discoveryv1.EndpointSlice) { s.AddressType = discoveryv1.AddressTypeFQDN }), nil},
		// kube-proxy's EndpointSlice informer does not filter on the proxy name:
		// the Service decides.
		{"labelled for another proxy", testSlice(func(s *discoveryv1.EndpointSlice) { s.Labels[LabelServiceProxyName] = "other" }), wantSlice()},
		{"of a headless Service", testSlice(func(s *discoveryv1.EndpointSlice) { s.Labels[v1.IsHeadlessService] = "" }), nil},
		{
			"only the first address",
			testSlice(func(s *discoveryv1.EndpointSlice) {
				s.Endpoints[0].Addresses = []string{"10.1.0.5", "10.1.0.6", "junk"}
			}),
			wantSlice(),
		},
		{
			"no node name or zone",
			testSlice(func(s *discoveryv1.EndpointSlice) { s.Endpoints[0].NodeName, s.Endpoints[0].Zone = nil, nil }),
			wantSlice(func(s *EndpointSlice) { s.Endpoints[0].NodeName, s.Endpoints[0].Zone = "", "" }),
		},
		{
			"zone hints",
			testSlice(func(s *discoveryv1.EndpointSlice) {
				s.Endpoints[0].Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "z1"}, {Name: "z3"}}}
			}),
			wantSlice(func(s *EndpointSlice) { s.Endpoints[0].ZoneHints = []string{"z1", "z3"} }),
		},
		{
			"node hints only: no zone hints",
			testSlice(func(s *discoveryv1.EndpointSlice) {
				s.Endpoints[0].Hints = &discoveryv1.EndpointHints{ForNodes: []discoveryv1.ForNode{{Name: "node-a"}}}
			}),
			wantSlice(func(s *EndpointSlice) { s.Endpoints[0].NodeHints = []string{"node-a"} }),
		},
		{
			"node and zone hints",
			testSlice(func(s *discoveryv1.EndpointSlice) {
				s.Endpoints[0].Hints = &discoveryv1.EndpointHints{
					ForZones: []discoveryv1.ForZone{{Name: "z1"}},
					ForNodes: []discoveryv1.ForNode{{Name: "node-a"}, {Name: "node-b"}},
				}
			}),
			wantSlice(func(s *EndpointSlice) {
				s.Endpoints[0].ZoneHints = []string{"z1"}
				s.Endpoints[0].NodeHints = []string{"node-a", "node-b"}
			}),
		},
		{
			"ports: nil port skipped, defaults",
			testSlice(func(s *discoveryv1.EndpointSlice) {
				s.Ports = []discoveryv1.EndpointPort{
					{Name: ptr("http"), Port: nil},
					{Name: ptr("dns"), Protocol: ptr(v1.ProtocolUDP), Port: ptr[int32](53)},
					{Port: ptr[int32](8080)},
					{Name: ptr("sctp"), Protocol: ptr(v1.ProtocolSCTP), Port: ptr[int32](9000)},
				}
			}),
			wantSlice(func(s *EndpointSlice) {
				s.Ports = []EndpointPort{
					{Name: "dns", Protocol: UDP, Port: 53},
					{Name: "", Protocol: TCP, Port: 8080},
					{Name: "sctp", Protocol: SCTP, Port: 9000},
				}
			}),
		},
		{
			"no endpoints",
			testSlice(func(s *discoveryv1.EndpointSlice) { s.Endpoints = nil }),
			wantSlice(func(s *EndpointSlice) { s.Endpoints = nil }),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ConvertEndpointSlice(tt.slice)
			if err != nil {
				t.Fatalf("ConvertEndpointSlice: %v", err)
			}
			if diff := cmp.Diff(tt.want, got, cmpNet); diff != "" {
				t.Errorf("ConvertEndpointSlice (-want +got):\n%s", diff)
			}
		})
	}
}

func TestConvertEndpointSliceErrors(t *testing.T) {
	tests := []struct {
		name   string
		slice  *discoveryv1.EndpointSlice
		fields []string
		msg    string
	}{
		{
			"no service-name label",
			testSlice(func(s *discoveryv1.EndpointSlice) { s.Labels = nil }),
			[]string{"metadata.labels[kubernetes.io/service-name]"}, "required",
		},
		{
			"bad address",
			testSlice(func(s *discoveryv1.EndpointSlice) { s.Endpoints[0].Addresses = []string{"10.1.0.256"} }),
			[]string{"endpoints[0].addresses[0]"}, "invalid IP address",
		},
		{
			"address of the wrong family",
			testSlice(func(s *discoveryv1.EndpointSlice) { s.Endpoints[0].Addresses = []string{"fd00:1::5"} }),
			[]string{"endpoints[0].addresses[0]"}, "does not match addressType IPv4",
		},
		{
			"no address",
			testSlice(func(s *discoveryv1.EndpointSlice) { s.Endpoints[0].Addresses = nil }),
			[]string{"endpoints[0].addresses"}, "required",
		},
		{
			"unknown protocol",
			testSlice(func(s *discoveryv1.EndpointSlice) { s.Ports[0].Protocol = ptr(v1.Protocol("TCPX")) }),
			[]string{"ports[0].protocol"}, `unsupported protocol "TCPX"`,
		},
		{"port 0", testSlice(func(s *discoveryv1.EndpointSlice) { s.Ports[0].Port = ptr[int32](0) }), []string{"ports[0].port"}, "out of range"},
		{"port too big", testSlice(func(s *discoveryv1.EndpointSlice) { s.Ports[0].Port = ptr[int32](65536) }), []string{"ports[0].port"}, "out of range"},
		{
			"duplicate port name",
			testSlice(func(s *discoveryv1.EndpointSlice) {
				s.Ports = append(s.Ports, discoveryv1.EndpointPort{Name: ptr("http"), Port: ptr[int32](8081)})
			}),
			[]string{"ports[1].name"}, `duplicate port name "http"`,
		},
		{
			"two unnamed ports",
			testSlice(func(s *discoveryv1.EndpointSlice) {
				s.Ports = []discoveryv1.EndpointPort{{Port: ptr[int32](8080)}, {Port: ptr[int32](8081)}}
			}),
			[]string{"ports[1].name"}, `duplicate port name ""`,
		},
		{"unknown address type", testSlice(func(s *discoveryv1.EndpointSlice) { s.AddressType = "IPX" }), []string{"addressType"}, `unsupported address type "IPX"`},
		{
			"empty zone hint",
			testSlice(func(s *discoveryv1.EndpointSlice) {
				s.Endpoints[0].Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: ""}}}
			}),
			[]string{"endpoints[0].hints.forZones[0].name"}, "required",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ConvertEndpointSlice(tt.slice)
			if got != nil {
				t.Errorf("ConvertEndpointSlice returned %+v with the error", got)
			}
			checkObjectError(t, err, KindEndpointSlice, "default", "web-abc", tt.fields...)
			if err != nil && !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("error %q does not contain %q", err, tt.msg)
			}
		})
	}
}

func testNode(mods ...func(*v1.Node)) *v1.Node {
	n := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{v1.LabelTopologyZone: "z1"}},
		Status: v1.NodeStatus{Addresses: []v1.NodeAddress{
			{Type: v1.NodeHostName, Address: "node-a"},
			{Type: v1.NodeInternalIP, Address: "192.168.0.10"},
			{Type: v1.NodeInternalIP, Address: "fd00:168::10"},
			{Type: v1.NodeExternalIP, Address: "203.0.113.10"},
			{Type: v1.NodeExternalIP, Address: "192.168.0.10"},
			{Type: v1.NodeInternalDNS, Address: "node-a.example.com"},
		}},
	}
	for _, m := range mods {
		m(n)
	}
	return n
}

func TestConvertNode(t *testing.T) {
	got, err := ConvertNode(testNode())
	if err != nil {
		t.Fatalf("ConvertNode: %v", err)
	}
	want := Node{Name: "node-a", Zone: "z1", Addresses: addrs("192.168.0.10", "fd00:168::10", "203.0.113.10"),
		PrimaryIPs: addrs("192.168.0.10", "fd00:168::10")}
	if diff := cmp.Diff(want, got, cmpNet); diff != "" {
		t.Errorf("ConvertNode (-want +got):\n%s", diff)
	}

	// An InternalIP is primary even after an ExternalIP of its family; without an
	// InternalIP the first ExternalIP is.
	got, err = ConvertNode(testNode(func(n *v1.Node) {
		n.Status.Addresses = []v1.NodeAddress{
			{Type: v1.NodeExternalIP, Address: "203.0.113.10"},
			{Type: v1.NodeExternalIP, Address: "2001:db8::10"},
			{Type: v1.NodeInternalIP, Address: "192.168.0.10"},
			{Type: v1.NodeExternalIP, Address: "2001:db8::11"},
		}
	}))
	if err != nil {
		t.Fatalf("ConvertNode: %v", err)
	}
	if diff := cmp.Diff(addrs("192.168.0.10", "2001:db8::10"), got.PrimaryIPs, cmpNet); diff != "" {
		t.Errorf("PrimaryIPs (-want +got):\n%s", diff)
	}
	if ip := got.PrimaryIP(true); ip != netip.MustParseAddr("2001:db8::10") {
		t.Errorf("PrimaryIP(IPv6) = %v, want 2001:db8::10", ip)
	}
	if ip := (Node{Addresses: addrs("fd00::1", "10.0.0.1")}).PrimaryIP(false); ip != netip.MustParseAddr("10.0.0.1") {
		t.Errorf("PrimaryIP of a Node without PrimaryIPs = %v, want its first IPv4 address 10.0.0.1", ip)
	}

	// spec.podCIDRs are kept, host bits cleared, for the NodeCIDR detector.
	got, err = ConvertNode(testNode(func(n *v1.Node) { n.Spec.PodCIDRs = []string{"10.1.0.0/24", "fd00:1::5/64"} }))
	if err != nil {
		t.Fatalf("ConvertNode: %v", err)
	}
	if diff := cmp.Diff([]netip.Prefix{netip.MustParsePrefix("10.1.0.0/24"), netip.MustParsePrefix("fd00:1::/64")}, got.PodCIDRs, cmpNet); diff != "" {
		t.Errorf("PodCIDRs (-want +got):\n%s", diff)
	}
	_, err = ConvertNode(testNode(func(n *v1.Node) { n.Spec.PodCIDRs = []string{"10.1.0.0/24", "10.1.0.0/33"} }))
	checkObjectError(t, err, KindNode, "", "node-a", "spec.podCIDRs[1]")

	got, err = ConvertNode(testNode(func(n *v1.Node) { n.Labels = nil }))
	if err != nil || got.Zone != "" {
		t.Errorf("ConvertNode without zone label = %+v, %v; want no zone", got, err)
	}

	got, err = ConvertNode(testNode(func(n *v1.Node) {
		n.Status.Addresses[2].Address = "fd00::g"
		n.Status.Addresses[3].Address = "203.0.113"
		n.Status.Addresses[5].Address = "not checked: a DNS name"
	}))
	checkObjectError(t, err, KindNode, "", "node-a", "status.addresses[2].address", "status.addresses[3].address")
	if !strings.HasPrefix(err.Error(), "node node-a: status.addresses[2].address: invalid IP address") {
		t.Errorf("error %q does not start as expected", err)
	}
	if diff := cmp.Diff(Node{Name: "node-a"}, got, cmpNet); diff != "" {
		t.Errorf("ConvertNode of a malformed Node (-want +got):\n%s", diff)
	}
}
