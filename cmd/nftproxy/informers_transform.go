package main

import (
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftproxy/nftproxy/proxier"
	"github.com/nftproxy/nftproxy/proxier/state"
)

// The informers' caches hold every Service and EndpointSlice, and this node's
// Node, for as long as the daemon runs. The transforms below replace each object,
// before it is cached and handed to the proxier, by a copy of what the proxier
// reads of it (state.Convert* and the Proxier's event handlers) and what the
// handlers compare (the resource version): managed fields, other annotations and
// labels, owner references, a Service's selector and conditions, the endpoints'
// target references, a Node's images and conditions are never read. A field the
// proxier starts to read must be kept here; the tests compare what the proxier
// makes of transformed and original objects.
//
// A transform returns objects of other types (the informers' tombstones) as they
// are, and is idempotent, as client-go asks.

// transformService keeps what the proxier reads of a Service.
func transformService(obj any) (any, error) {
	svc, ok := obj.(*v1.Service)
	if !ok {
		return obj, nil
	}
	out := &v1.Service{
		ObjectMeta: keptMeta(svc.ObjectMeta, []string{state.LabelServiceProxyName}, nil),
		Spec:       svc.Spec,
	}
	out.Spec.Selector = nil
	out.Status.LoadBalancer.Ingress = svc.Status.LoadBalancer.Ingress
	return out, nil
}

// transformEndpointSlice keeps what the proxier reads of an EndpointSlice.
func transformEndpointSlice(obj any) (any, error) {
	slice, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return obj, nil
	}
	out := &discoveryv1.EndpointSlice{
		ObjectMeta: keptMeta(slice.ObjectMeta,
			[]string{discoveryv1.LabelServiceName, v1.IsHeadlessService},
			[]string{proxier.LastChangeTriggerTimeAnnotation}),
		AddressType: slice.AddressType,
		Ports:       slice.Ports,
	}
	if slice.Endpoints != nil {
		out.Endpoints = make([]discoveryv1.Endpoint, len(slice.Endpoints))
	}
	for i, e := range slice.Endpoints {
		out.Endpoints[i] = discoveryv1.Endpoint{Addresses: e.Addresses, Conditions: e.Conditions,
			NodeName: e.NodeName, Zone: e.Zone, Hints: e.Hints}
	}
	return out, nil
}

// transformNode keeps what the proxier reads of a Node: its zone, addresses and
// pod ranges, and whether it is being deleted or drained (its deletion time and
// taints).
func transformNode(obj any) (any, error) {
	node, ok := obj.(*v1.Node)
	if !ok {
		return obj, nil
	}
	out := &v1.Node{
		ObjectMeta: keptMeta(node.ObjectMeta, []string{v1.LabelTopologyZone}, nil),
		Spec:       v1.NodeSpec{PodCIDRs: node.Spec.PodCIDRs, Taints: node.Spec.Taints},
		Status:     v1.NodeStatus{Addresses: node.Status.Addresses},
	}
	out.DeletionTimestamp = node.DeletionTimestamp
	return out, nil
}

// keptMeta returns the name, namespace and resource version of m, with those of
// its labels and annotations whose keys are given.
func keptMeta(m metav1.ObjectMeta, labels, annotations []string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, ResourceVersion: m.ResourceVersion,
		Labels: keptKeys(m.Labels, labels), Annotations: keptKeys(m.Annotations, annotations)}
}

// keptKeys returns the entries of m with the given keys, nil when there are none.
func keptKeys(m map[string]string, keys []string) map[string]string {
	var out map[string]string
	for _, k := range keys {
		if v, ok := m[k]; ok {
			if out == nil {
				out = make(map[string]string, len(keys))
			}
			out[k] = v
		}
	}
	return out
}
