package main

import (
	"fmt"
	"reflect"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/randfill"

	"github.com/nftproxy/nftproxy/proxier"
	"github.com/nftproxy/nftproxy/proxier/state"
)

// plausible are the strings random objects are filled with: addresses, ranges,
// enum values, names and the label and annotation keys the proxier reads, so that
// the objects convert, or fail to, in many ways.
var plausible = []string{
	"", "10.1.0.1", "10.1.0.2", "172.30.0.10", "fd00::1", "not-an-ip", "10.0.0.0/24", "fd00::/64",
	"TCP", "UDP", "SCTP", "IPv4", "IPv6", "FQDN",
	"ClusterIP", "NodePort", "LoadBalancer", "ExternalName", "None", "Local", "Cluster", "ClientIP",
	"VIP", "Proxy", "InternalIP", "ExternalIP", "Hostname",
	"node-a", "node-b", "z1", "z2", "http", "dns", "web", "default",
	discoveryv1.LabelServiceName, v1.IsHeadlessService, state.LabelServiceProxyName, v1.LabelTopologyZone,
	proxier.LastChangeTriggerTimeAnnotation, "2026-11-28T05:00:00Z", proxier.TaintToBeDeleted,
	"kubectl.kubernetes.io/last-applied-configuration",
}

// filler returns a randfill.Filler of plausible strings, enum values and ports.
func filler(seed int64) *randfill.Filler {
	return randfill.NewWithSeed(seed).NilChance(0.2).NumElements(0, 3).Funcs(
		func(s *string, c randfill.Continue) { *s = plausible[c.Intn(len(plausible))] },
		func(n *int32, c randfill.Continue) { *n = []int32{0, 53, 80, 8080, 30080, 31000, 70000, -1}[c.Intn(8)] },
		pick[v1.ServiceType]("ClusterIP", "NodePort", "LoadBalancer", "ExternalName", ""),
		pick[v1.Protocol]("TCP", "UDP", "SCTP", "", "ICMP"),
		pick[discoveryv1.AddressType]("IPv4", "IPv6", "FQDN"),
		pick[v1.ServiceExternalTrafficPolicy]("Local", "Cluster", ""),
		pick[v1.ServiceInternalTrafficPolicy]("Local", "Cluster"),
		pick[v1.ServiceAffinity]("ClientIP", "None", ""),
		pick[v1.LoadBalancerIPMode]("VIP", "Proxy", "Other"),
		pick[v1.NodeAddressType]("InternalIP", "ExternalIP", "Hostname"),
	)
}

// pick returns a randfill function that sets a T to one of vals.
func pick[T ~string](vals ...T) func(*T, randfill.Continue) {
	return func(v *T, c randfill.Continue) { *v = vals[c.Intn(len(vals))] }
}

// converted is what the proxier makes of an object: its conversion, the error's
// text, and what its event handlers read besides.
type converted struct {
	Value any
	Err   string
	Extra []any
}

func convertObject(obj any) converted {
	var c converted
	var err error
	switch o := obj.(type) {
	case *v1.Service:
		c.Value, err = state.ConvertService(o)
		c.Extra = []any{o.Namespace, o.Name, o.ResourceVersion}
	case *discoveryv1.EndpointSlice:
		c.Value, err = state.ConvertEndpointSlice(o)
		c.Extra = []any{o.Namespace, o.Name, o.ResourceVersion, o.AddressType,
			o.Labels[discoveryv1.LabelServiceName], o.Annotations[proxier.LastChangeTriggerTimeAnnotation]}
	case *v1.Node:
		c.Value, err = state.ConvertNode(o)
		var taints []string
		for _, t := range o.Spec.Taints {
			taints = append(taints, t.Key)
		}
		c.Extra = []any{o.Name, o.ResourceVersion, o.DeletionTimestamp != nil, taints}
	default:
		panic(fmt.Sprintf("unexpected %T", obj))
	}
	if err != nil {
		c.Err = err.Error()
	}
	return c
}

// TestTransformsKeepWhatTheProxierReads fills Services, EndpointSlices and Nodes
// at random, and checks that the proxier makes the same of each transformed
// object as of the original, that the transforms are idempotent, and that they
// drop what the proxier does not read.
func TestTransformsKeepWhatTheProxierReads(t *testing.T) {
	transforms := []struct {
		name string
		new  func() any
		fn   cache.TransformFunc
	}{
		{"Service", func() any { return &v1.Service{} }, transformService},
		{"EndpointSlice", func() any { return &discoveryv1.EndpointSlice{} }, transformEndpointSlice},
		{"Node", func() any { return &v1.Node{} }, transformNode},
	}
	for _, tf := range transforms {
		valid := 0
		for seed := range int64(2000) {
			orig := tf.new()
			filler(seed).Fill(orig)
			if n, ok := orig.(*v1.Node); ok && seed%2 == 0 {
				n.DeletionTimestamp = &metav1.Time{} // the filler leaves it nil
			}
			want := convertObject(orig)
			got, err := tf.fn(orig)
			if err != nil {
				t.Fatalf("%s seed %d: %v", tf.name, seed, err)
			}
			if c := convertObject(got); !reflect.DeepEqual(c, want) {
				t.Fatalf("%s seed %d: the proxier makes %+v of the transformed object, %+v of the original", tf.name, seed, c, want)
			}
			again, _ := tf.fn(got)
			if !reflect.DeepEqual(again, got) {
				t.Fatalf("%s seed %d: transforming twice differs from once", tf.name, seed)
			}
			if want.Err == "" && want.Value != nil {
				valid++
			}
		}
		if valid < 20 {
			t.Errorf("%s: only %d of the random objects were valid", tf.name, valid)
		}
	}
}

func TestTransformsDropWhatTheProxierDoesNotRead(t *testing.T) {
	orig := &discoveryv1.EndpointSlice{}
	filler(1).NilChance(0).NumElements(2, 2).Fill(orig)
	got, _ := transformEndpointSlice(orig)
	s := got.(*discoveryv1.EndpointSlice)
	if s.ManagedFields != nil || s.OwnerReferences != nil || s.Endpoints[0].TargetRef != nil || s.Endpoints[0].DeprecatedTopology != nil {
		t.Errorf("transformed slice keeps fields the proxier does not read: %+v", s)
	}
	node := &v1.Node{}
	filler(1).NilChance(0).NumElements(2, 2).Fill(node)
	got, _ = transformNode(node)
	if n := got.(*v1.Node); n.Status.Images != nil || n.Status.Conditions != nil || n.Status.Capacity != nil {
		t.Errorf("transformed Node keeps its images, conditions or capacity")
	}
	// A tombstone passes as it is.
	tomb := cache.DeletedFinalStateUnknown{Key: "default/web", Obj: orig}
	if got, _ := transformService(tomb); !reflect.DeepEqual(got, tomb) {
		t.Errorf("a tombstone was changed to %+v", got)
	}
}
