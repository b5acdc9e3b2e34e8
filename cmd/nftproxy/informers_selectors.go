package main

import (
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"

	"github.com/nftproxy/nftproxy/proxier/state"
)

// serviceListOptions narrows the Service informer as kube-proxy's: Services labelled
// for another proxy (service.kubernetes.io/service-proxy-name, any value) and
// headless Services are never listed. A Service that gains the label leaves the
// informer's view, which the handlers see as a deletion.
func serviceListOptions(lo *metav1.ListOptions) {
	lo.LabelSelector = labels.NewSelector().Add(mustRequirement(state.LabelServiceProxyName)).String()
	lo.FieldSelector = fields.OneTermNotEqualSelector("spec.clusterIP", v1.ClusterIPNone).String()
}

// sliceListOptions narrows the EndpointSlice informer as kube-proxy's: slices of
// headless Services (service.kubernetes.io/headless) are never listed. Slices are
// not filtered by the proxy name: their Service decides.
func sliceListOptions(lo *metav1.ListOptions) {
	lo.LabelSelector = labels.NewSelector().Add(mustRequirement(v1.IsHeadlessService)).String()
}

// mustRequirement returns the requirement that label key is absent. It panics only on
// an invalid key, which the constants above are not.
func mustRequirement(key string) labels.Requirement {
	r, err := labels.NewRequirement(key, selection.DoesNotExist, nil)
	if err != nil {
		panic(err)
	}
	return *r
}
