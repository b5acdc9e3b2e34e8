package main

import (
	"context"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
)

// serviceCIDRHandler receives ServiceCIDR events (proxier.Proxier).
type serviceCIDRHandler interface {
	OnServiceCIDRUpdate(*networkingv1.ServiceCIDR)
	OnServiceCIDRDelete(*networkingv1.ServiceCIDR)
}

// startServiceCIDRInformer watches the ServiceCIDR objects (networking.k8s.io/v1)
// and hands every event to h, until ctx is done. It returns the factory it
// started.
//
// The start does not wait for the first list: a cluster without the API (before
// Kubernetes 1.33) or a role without list and watch on servicecidrs must not keep the
// proxier from syncing. Until the list arrives, and without it, the configured
// serviceCIDR alone bounds the drop of unallocated addresses; the objects' ranges
// come with a later, incremental sync.
func startServiceCIDRInformer(ctx context.Context, client kubernetes.Interface, h serviceCIDRHandler) (informers.SharedInformerFactory, error) {
	f := informers.NewSharedInformerFactory(client, 0)
	if _, err := f.Networking().V1().ServiceCIDRs().Informer().AddEventHandler(handler(h.OnServiceCIDRUpdate, h.OnServiceCIDRDelete)); err != nil {
		return f, err
	}
	f.Start(ctx.Done())
	return f, nil
}
