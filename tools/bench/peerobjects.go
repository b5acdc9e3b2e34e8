package main

import (
	"context"
	"fmt"
	"net/netip"
	"sync"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	kptr "k8s.io/utils/ptr"
)

// The peer phase's objects: ClusterIP Services without selectors, whose EndpointSlices
// the bench writes itself (managed by peerManager, so the EndpointSlice controller leaves
// them alone), 100 Services a namespace as the synthetic cluster has them.

const (
	peerManager = "nftproxy-bench"
	// peerEndpointBase numbers the generated endpoints: addresses no pod has, outside
	// the lab's cluster CIDR; endpoints added by changes continue the numbering.
	peerEndpointBase = "10.100.0.1"
)

// peerObjects writes and changes the peer phase's objects.
type peerObjects struct {
	client kubernetes.Interface
	// slices are the generated Services' EndpointSlices as last written, by index.
	mu     sync.Mutex
	slices []*discoveryv1.EndpointSlice
	next   int // endpoints numbered so far
}

// peerSlice returns the EndpointSlice of Service name in namespace ns with the
// endpoints addrs, on nodes other than the lab's.
func peerSlice(ns, name string, addrs []netip.Addr, node string) *discoveryv1.EndpointSlice {
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-bench", Labels: map[string]string{
			discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: peerManager}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: kptr.To("http"), Protocol: kptr.To(v1.ProtocolTCP), Port: kptr.To[int32](targetPort)}},
	}
	for i, a := range addrs {
		n := node
		if n == "" {
			n = fmt.Sprintf("node-%d", 1+i%nodes)
		}
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{a.String()}, NodeName: kptr.To(n),
			Conditions: discoveryv1.EndpointConditions{Ready: kptr.To(true), Serving: kptr.To(true), Terminating: kptr.To(false)}})
	}
	return sl
}

// peerService returns ClusterIP Service name of namespace ns: TCP port 80 to 8080.
func peerService(ns, name string) *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, Ports: []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP,
			Port: servicePort, TargetPort: intstr.FromInt32(targetPort)}}},
	}
}

// createNamespace creates namespace name unless it exists.
func createNamespace(ctx context.Context, client kubernetes.Interface, name string) error {
	_, err := client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("namespace %s: %w", name, err)
	}
	return nil
}

// grow creates Services len(o.slices) to n-1 with endpointsPerService endpoints each,
// with workers requests in flight.
func (o *peerObjects) grow(ctx context.Context, n, workers int) error {
	from := len(o.slices)
	for ns := from / 100; ns <= (n-1)/100; ns++ {
		if err := createNamespace(ctx, o.client, serviceName(ns*100).Namespace); err != nil {
			return err
		}
	}
	o.slices = append(o.slices, make([]*discoveryv1.EndpointSlice, n-from)...)
	o.next = max(o.next, n*endpointsPerService)
	base := netip.MustParseAddr(peerEndpointBase)
	idx := make(chan int)
	errc := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range idx {
				name := serviceName(i)
				if _, err := o.client.CoreV1().Services(name.Namespace).Create(ctx, peerService(name.Namespace, name.Name), metav1.CreateOptions{}); err != nil {
					errc <- fmt.Errorf("service %s: %w", name, err)
					return
				}
				addrs := make([]netip.Addr, endpointsPerService)
				for j := range addrs {
					addrs[j] = nthAddr(base, i*endpointsPerService+j)
				}
				sl, err := o.client.DiscoveryV1().EndpointSlices(name.Namespace).Create(ctx, peerSlice(name.Namespace, name.Name, addrs, ""), metav1.CreateOptions{})
				if err != nil {
					errc <- fmt.Errorf("endpointslice of %s: %w", name, err)
					return
				}
				o.mu.Lock()
				o.slices[i] = sl
				o.mu.Unlock()
			}
		}()
	}
	var err error
feed:
	for i := from; i < n; i++ {
		select {
		case idx <- i:
		case err = <-errc:
			break feed
		case <-ctx.Done():
			err = ctx.Err()
			break feed
		}
	}
	close(idx)
	wg.Wait()
	if err == nil && len(errc) > 0 {
		err = <-errc
	}
	return err
}

// toggle changes Service i's endpoints: with endpointsPerService it gains a new one,
// with more it loses its last, so that repeated changes keep the cluster's shape.
func (o *peerObjects) toggle(ctx context.Context, i int) error {
	o.mu.Lock()
	sl := o.slices[i].DeepCopy()
	if len(sl.Endpoints) <= endpointsPerService {
		a := nthAddr(netip.MustParseAddr(peerEndpointBase), o.next)
		o.next++
		sl.Endpoints = append(sl.Endpoints, peerSlice("", "", []netip.Addr{a}, "").Endpoints[0])
	} else {
		sl.Endpoints = sl.Endpoints[:len(sl.Endpoints)-1]
	}
	o.mu.Unlock()
	up, err := o.client.DiscoveryV1().EndpointSlices(sl.Namespace).Update(ctx, sl, metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("endpointslice %s/%s: %w", sl.Namespace, sl.Name, err)
	}
	o.mu.Lock()
	o.slices[i] = up
	o.mu.Unlock()
	return nil
}
