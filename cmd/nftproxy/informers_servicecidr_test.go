package main

import (
	"context"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier"
)

func TestServiceCIDRInformer(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewSimpleClientset(&networkingv1.ServiceCIDR{
		ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"},
		Spec:       networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/12"}},
	})
	var calls atomic.Int32
	p, err := proxier.New(proxier.Config{
		NodeName: "node-a",
		NewNFT: func(fam knftables.Family, table string) (knftables.Interface, error) {
			return knftables.NewFake(fam, table), nil
		},
		OnChange: func() { calls.Add(1) },
	})
	if err != nil {
		t.Fatal(err)
	}
	tr := p.Tracker()
	f, err := startServiceCIDRInformer(ctx, client, p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Shutdown()
	defer cancel()
	waitFor := func(want ...string) {
		t.Helper()
		var wantP []netip.Prefix
		for _, s := range want {
			wantP = append(wantP, netip.MustParsePrefix(s))
		}
		deadline := time.Now().Add(10 * time.Second)
		for !slices.Equal(tr.State().ServiceCIDRs, wantP) {
			if time.Now().After(deadline) {
				t.Fatalf("ServiceCIDRs %v, want %v", tr.State().ServiceCIDRs, wantP)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor("10.96.0.0/12")

	extra := &networkingv1.ServiceCIDR{
		ObjectMeta: metav1.ObjectMeta{Name: "extra"},
		Spec:       networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.100.0.0/16", "fd00:10::/108"}},
	}
	if _, err := client.NetworkingV1().ServiceCIDRs().Create(ctx, extra, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("10.96.0.0/12", "10.100.0.0/16", "fd00:10::/108")
	if err := client.NetworkingV1().ServiceCIDRs().Delete(ctx, "kubernetes", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("10.100.0.0/16", "fd00:10::/108")
	if calls.Load() < 3 {
		t.Errorf("the Proxier asked for %d syncs, want one per event (3)", calls.Load())
	}
}
