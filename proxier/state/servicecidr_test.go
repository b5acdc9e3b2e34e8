package state

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func serviceCIDR(name string, cidrs ...string) *networkingv1.ServiceCIDR {
	return &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: cidrs}}
}

func TestConvertServiceCIDR(t *testing.T) {
	got, err := ConvertServiceCIDR(serviceCIDR("kubernetes", "10.96.0.0/12", "fd00:10:96::5/112"))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(prefixes("10.96.0.0/12", "fd00:10:96::/112"), got, cmpNet); diff != "" {
		t.Errorf("ConvertServiceCIDR (-want +got):\n%s", diff)
	}

	_, err = ConvertServiceCIDR(serviceCIDR("bad", "10.96.0.0/12", "10.100.0.0/16", "10.300.0.0/16"))
	checkObjectError(t, err, KindServiceCIDR, "", "bad", "spec.cidrs", "spec.cidrs[1]", "spec.cidrs[2]")
	if !strings.HasPrefix(err.Error(), "servicecidr bad: spec.cidrs: 3 CIDRs") {
		t.Errorf("error %q does not name the object and field first", err)
	}
	_, err = ConvertServiceCIDR(serviceCIDR("mapped", "::ffff:10.0.0.0/104"))
	checkObjectError(t, err, KindServiceCIDR, "", "mapped", "spec.cidrs[0]")
}

func TestTrackerServiceCIDRs(t *testing.T) {
	tr := NewTracker("node-a")
	mustNil(t, tr.UpdateService(named("web")))
	tr.TakeChanged()
	before := tr.State()
	mustNil(t, tr.UpdateServiceCIDR(serviceCIDR("kubernetes", "172.30.0.0/16", "fd00:30::/108")))
	mustNil(t, tr.UpdateServiceCIDR(serviceCIDR("extra", "172.31.0.0/16")))
	st := tr.State()
	if st == before {
		t.Fatal("State did not change with the ServiceCIDRs")
	}
	if diff := cmp.Diff(prefixes("172.30.0.0/16", "172.31.0.0/16", "fd00:30::/108"), st.ServiceCIDRs, cmpNet); diff != "" {
		t.Errorf("ServiceCIDRs (-want +got):\n%s", diff)
	}
	if got := changedNames(tr); len(got) != 0 {
		t.Errorf("changed %v: no Service changes with the service ranges", got)
	}
	if len(serviceNames(st)) != 1 {
		t.Errorf("Services %v", serviceNames(st))
	}

	// The same ranges again: the same snapshot.
	mustNil(t, tr.UpdateServiceCIDR(serviceCIDR("extra", "172.31.0.0/16")))
	if tr.State() != st {
		t.Error("an unchanged ServiceCIDR made a new snapshot")
	}

	// A malformed update drops the object's ranges, keeps the error, serves the rest.
	err := tr.UpdateServiceCIDR(serviceCIDR("extra", "172.31.0.0/33"))
	checkObjectError(t, err, KindServiceCIDR, "", "extra", "spec.cidrs[0]")
	if diff := cmp.Diff(prefixes("172.30.0.0/16", "fd00:30::/108"), tr.State().ServiceCIDRs, cmpNet); diff != "" {
		t.Errorf("ServiceCIDRs after a malformed update (-want +got):\n%s", diff)
	}
	if errs := tr.Errors(); len(errs) != 1 || !errors.Is(errs[0], err) {
		t.Errorf("Errors() = %v, want the ServiceCIDR's", errs)
	}
	tr.DeleteServiceCIDR(serviceCIDR("extra"))
	if errs := tr.Errors(); len(errs) != 0 {
		t.Errorf("Errors() after the delete = %v", errs)
	}
	tr.DeleteServiceCIDR(serviceCIDR("kubernetes"))
	if got := tr.State().ServiceCIDRs; got != nil {
		t.Errorf("ServiceCIDRs after deleting all = %v", got)
	}
}

func TestLoadClusterServiceCIDR(t *testing.T) {
	const text = `apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata: {name: kubernetes}
spec:
  cidrs: [172.30.0.0/16, "fd00:30::/108"]
---
apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata: {name: broken}
spec:
  cidrs:
  - 172.31.0.0/16
  - not-a-cidr
`
	st, errs, err := loadString(text, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(prefixes("172.30.0.0/16", "fd00:30::/108"), st.ServiceCIDRs, cmpNet); diff != "" {
		t.Errorf("ServiceCIDRs (-want +got):\n%s", diff)
	}
	if len(errs) != 1 || !strings.HasPrefix(errs[0].Error(), `test.yaml: document 2 (line 13): servicecidr broken: spec.cidrs[1]: invalid CIDR`) {
		t.Errorf("object errors %v", errs)
	}

	_, _, err = loadString("apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {name: x}\nspec: {cidr: [10.0.0.0/8]}\n", "node-a")
	if err == nil || !strings.Contains(err.Error(), `servicecidr x: unknown field "spec.cidr"`) {
		t.Errorf("error %v, want the unknown field named", err)
	}
}
