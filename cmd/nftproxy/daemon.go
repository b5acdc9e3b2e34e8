package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/nftproxy/nftproxy/proxier"
	"github.com/nftproxy/nftproxy/proxier/health"
	"github.com/nftproxy/nftproxy/proxier/metrics"
	"github.com/nftproxy/nftproxy/proxier/runner"
)

// cacheSyncTimeout bounds the wait for the informers' first list.
const cacheSyncTimeout = 5 * time.Minute

// runDaemon runs the proxier until ctx is done: servers first (so that a port in use
// fails the start), then the informers, then the sync loop once they have synced.
func runDaemon(ctx context.Context, o *Options, log *slog.Logger, d deps) error {
	klog.SetSlogLogger(log) // client-go logs through klog
	client, err := d.newClient(o)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	// The informers' goroutines are gone when the daemon returns: a daemon started
	// again in the same process (the tests) shares klog's logger with nothing.
	var factories []informers.SharedInformerFactory
	defer func() {
		cancel()
		for _, f := range factories {
			f.Shutdown()
		}
	}()

	m := metrics.New()
	hz := health.NewHealthzServer(2*o.SyncPeriod, nil, m)
	sh := health.NewServiceHealthServer("", hz.Healthy, log)
	var r *runner.Runner
	p, err := proxier.New(proxier.Config{
		NodeName: o.NodeName, Ruleset: o.Ruleset, NewNFT: d.newNFT, Netlink: d.netlink,
		Metrics: m, Healthz: hz, ServiceHealth: sh, Conntrack: d.conntrack,
		Log: log, OnChange: func() { r.Run() },
	})
	if err != nil {
		return err
	}
	r = runner.New(afterFirstSync(p.SyncMode, takeoverSteps(o, d, m, log), log),
		runner.Config{MinInterval: o.MinSyncPeriod, SyncPeriod: o.SyncPeriod})

	var wg sync.WaitGroup
	errc := make(chan error, 2)
	serve := func(name, addr string, s func(context.Context, net.Listener) error) error {
		if addr == "" {
			return nil
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("%s server: %w", name, err)
		}
		log.Info("serving", "server", name, "address", l.Addr().String())
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s(ctx, l); err != nil {
				errc <- fmt.Errorf("%s server: %w", name, err)
			}
		}()
		return nil
	}
	defer wg.Wait()
	defer cancel()
	if err := serve("healthz", o.HealthzBindAddress, hz.Serve); err != nil {
		return err
	}
	metricsHandler := m.Handler()
	if o.EnableProfiling {
		metricsHandler = metrics.WithProfiling(metricsHandler)
	}
	err = serve("metrics", o.MetricsBindAddress, func(ctx context.Context, l net.Listener) error {
		return metrics.ServeHTTP(ctx, l, metricsHandler)
	})
	if err != nil {
		return err
	}
	go sh.Run(ctx)

	f, err := startServiceCIDRInformer(ctx, client, p)
	factories = append(factories, f)
	if err != nil {
		return err
	}
	fs, err := startInformers(ctx, client, o.NodeName, p)
	factories = append(factories, fs...)
	if err != nil {
		return err
	}
	if ctx.Err() != nil {
		return nil // stopped while waiting for the informers
	}
	log.Info("informers synced, starting the sync loop", "node", o.NodeName, "families", fmt.Sprint(p.Families()))
	wg.Add(1)
	go func() { defer wg.Done(); r.Loop(ctx) }()
	r.Run()

	select {
	case <-ctx.Done():
		log.Info("shutting down")
		return nil
	case err := <-errc:
		return err
	}
}

// startInformers watches Services and EndpointSlices (narrowed as kube-proxy's
// informers are: see serviceListOptions and sliceListOptions) and this node's Node,
// feeds them to p, and waits for their first list. The informers cache only what
// the proxier reads of each object (see transformService). It returns the factories it
// started, to be shut down once ctx is done.
func startInformers(ctx context.Context, client kubernetes.Interface, nodeName string, p *proxier.Proxier) ([]informers.SharedInformerFactory, error) {
	services := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(serviceListOptions), informers.WithTransform(transformService))
	slices := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(sliceListOptions), informers.WithTransform(transformEndpointSlice))
	nodes := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.FieldSelector = fields.OneTermEqualSelector(metav1.ObjectNameField, nodeName).String()
		}), informers.WithTransform(transformNode))

	handlers := []struct {
		informer cache.SharedIndexInformer
		h        cache.ResourceEventHandler
	}{
		{services.Core().V1().Services().Informer(), handler(p.OnServiceUpdate, p.OnServiceDelete)},
		{slices.Discovery().V1().EndpointSlices().Informer(), handler(p.OnEndpointSliceUpdate, p.OnEndpointSliceDelete)},
		{nodes.Core().V1().Nodes().Informer(), handler(p.OnNodeUpdate, p.OnNodeDelete)},
	}
	var synced []cache.InformerSynced
	for _, h := range handlers {
		reg, err := h.informer.AddEventHandler(h.h)
		if err != nil {
			return nil, fmt.Errorf("informer handler: %w", err)
		}
		synced = append(synced, reg.HasSynced)
	}
	started := []informers.SharedInformerFactory{services, slices, nodes}
	for _, f := range started {
		f.Start(ctx.Done())
	}
	wctx, cancel := context.WithTimeout(ctx, cacheSyncTimeout)
	defer cancel()
	if !cache.WaitForCacheSync(wctx.Done(), synced...) {
		if ctx.Err() != nil {
			return started, nil
		}
		return started, errors.New("informers did not sync within " + cacheSyncTimeout.String())
	}
	return started, nil
}

// handler adapts typed update and delete functions to an informer's handler,
// skipping updates that do not change the object and unwrapping tombstones.
func handler[T metav1.Object](update, del func(T)) cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if o, ok := obj.(T); ok {
				update(o)
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			o, ok := newObj.(T)
			old, okOld := oldObj.(T)
			if !ok || (okOld && old.GetResourceVersion() == o.GetResourceVersion()) {
				return
			}
			update(o)
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if o, ok := obj.(T); ok {
				del(o)
			}
		},
	}
}

// Typed handler instantiations, checked at compile time.
var (
	_ = handler[*v1.Service]
	_ = handler[*discoveryv1.EndpointSlice]
	_ = handler[*v1.Node]
)
