package main

import (
	"context"
	"log/slog"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"

	"github.com/nftproxy/nftproxy/proxier/state"
)

// startServiceCIDRInformer watches the ServiceCIDR objects (networking.k8s.io/v1),
// records them in t and calls changed after each event, until ctx is done. The
// Tracker unites their ranges with the configured serviceCIDR.
//
// The start does not wait for the first list: a cluster without the API (before
// Kubernetes 1.33) or a role without list and watch on servicecidrs must not keep the
// proxier from syncing. Until the list arrives, and without it, the configured
// serviceCIDR alone bounds the drop of unallocated addresses; the objects' ranges
// come with a later, incremental sync.
func startServiceCIDRInformer(ctx context.Context, client kubernetes.Interface, t *state.Tracker, changed func(), log *slog.Logger) error {
	f := informers.NewSharedInformerFactory(client, 0)
	update := func(c *networkingv1.ServiceCIDR) {
		if err := t.UpdateServiceCIDR(c); err != nil {
			log.Warn("ignoring invalid object", "kind", state.KindServiceCIDR, "err", err)
		}
		changed()
	}
	del := func(c *networkingv1.ServiceCIDR) {
		t.DeleteServiceCIDR(c)
		changed()
	}
	if _, err := f.Networking().V1().ServiceCIDRs().Informer().AddEventHandler(handler(update, del)); err != nil {
		return err
	}
	f.Start(ctx.Done())
	return nil
}
