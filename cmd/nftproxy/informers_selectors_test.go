package main

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestInformerListOptions(t *testing.T) {
	var svc, slice metav1.ListOptions
	serviceListOptions(&svc)
	sliceListOptions(&slice)
	for _, c := range []struct{ what, got, want string }{
		{"Service label selector", svc.LabelSelector, "!service.kubernetes.io/service-proxy-name"},
		{"Service field selector", svc.FieldSelector, "spec.clusterIP!=None"},
		{"EndpointSlice label selector", slice.LabelSelector, "!service.kubernetes.io/headless"},
		{"EndpointSlice field selector", slice.FieldSelector, ""},
	} {
		if c.got != c.want {
			t.Errorf("%s: %q, want %q", c.what, c.got, c.want)
		}
	}
}
