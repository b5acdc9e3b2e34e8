package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nftproxy/nftproxy/proxier/state"
)

// pluginName is the name nftrace has as a kubectl plugin (`kubectl nftrace ...`).
// Under it, nftrace traces the cluster of kubectl's configuration unless told
// otherwise.
const pluginName = "kubectl-nftrace"

// isPlugin says the program was invoked as the kubectl plugin.
func isPlugin(arg0 string) bool {
	return strings.TrimSuffix(filepath.Base(arg0), ".exe") == pluginName
}

// listTimeout bounds the reading of the API server's objects.
const listTimeout = 2 * time.Minute

// listPage is the number of objects asked for at once.
const listPage = 500

// newClientset makes the client of the API server; the tests make a fake one.
var newClientset = func(cfg *rest.Config) (kubernetes.Interface, error) {
	return kubernetes.NewForConfig(cfg)
}

// restConfig loads the client configuration as kubectl does: --kubeconfig, else
// the files of $KUBECONFIG, else ~/.kube/config; --context, else the current one.
func restConfig(o *options) (*rest.Config, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = o.kubeconfig
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: o.kubeContext})
	cfg, err := cc.ClientConfig()
	if clientcmd.IsEmptyConfig(err) {
		return nil, "", errors.New("kubeconfig: none found: give --kubeconfig FILE, or set $KUBECONFIG, or write ~/.kube/config")
	}
	if err != nil {
		return nil, "", fmt.Errorf("kubeconfig: %w", err)
	}
	cfg.UserAgent = "nftrace"
	name := "the API server " + cfg.Host
	if raw, err := cc.RawConfig(); err == nil {
		ctx := o.kubeContext
		if ctx == "" {
			ctx = raw.CurrentContext
		}
		if ctx != "" {
			name = fmt.Sprintf("the API server %s (context %s)", cfg.Host, ctx)
		}
	}
	return cfg, name, nil
}

// readAPIServer lists the Services, EndpointSlices, Nodes and ServiceCIDRs of the
// API server of o's kubeconfig. Its objects go into a Tracker as a cluster file's
// do, by the Tracker's Update methods, which the daemon's informers call too.
func readAPIServer(o *options, stderr io.Writer) (*clusterInput, error) {
	cfg, name, err := restConfig(o)
	if err != nil {
		return nil, err
	}
	c, err := newClientset(cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), listTimeout)
	defer cancel()
	services, err := listAll(ctx, func(opts metav1.ListOptions) ([]v1.Service, string, error) {
		l, err := c.CoreV1().Services("").List(ctx, opts)
		if err != nil {
			return nil, "", err
		}
		return l.Items, l.Continue, nil
	})
	if err != nil {
		return nil, fmt.Errorf("%s: listing Services: %w", name, err)
	}
	slices, err := listAll(ctx, func(opts metav1.ListOptions) ([]discoveryv1.EndpointSlice, string, error) {
		l, err := c.DiscoveryV1().EndpointSlices("").List(ctx, opts)
		if err != nil {
			return nil, "", err
		}
		return l.Items, l.Continue, nil
	})
	if err != nil {
		return nil, fmt.Errorf("%s: listing EndpointSlices: %w", name, err)
	}
	nodes, err := listAll(ctx, func(opts metav1.ListOptions) ([]v1.Node, string, error) {
		l, err := c.CoreV1().Nodes().List(ctx, opts)
		if err != nil {
			return nil, "", err
		}
		return l.Items, l.Continue, nil
	})
	if err != nil {
		return nil, fmt.Errorf("%s: listing Nodes: %w", name, err)
	}
	cidrs, err := listAll(ctx, func(opts metav1.ListOptions) ([]networkingv1.ServiceCIDR, string, error) {
		l, err := c.NetworkingV1().ServiceCIDRs().List(ctx, opts)
		if err != nil {
			return nil, "", err
		}
		return l.Items, l.Continue, nil
	})
	switch {
	case apierrors.IsNotFound(err):
		fmt.Fprintf(stderr, "nftrace: note: %s serves no ServiceCIDRs (networking.k8s.io/v1)\n", name)
		cidrs, err = nil, nil
	case apierrors.IsForbidden(err):
		// Optional, as for the daemon: the service CIDR may come from the flags.
		fmt.Fprintf(stderr, "nftrace: note: %s: listing ServiceCIDRs: %v\n", name, err)
		cidrs, err = nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s: listing ServiceCIDRs: %w", name, err)
	}
	in := &clusterInput{name: name}
	for i := range nodes {
		in.nodes = append(in.nodes, &nodes[i])
	}
	in.apply = func(t *state.Tracker) []error {
		var errs []error
		add := func(err error) {
			if err != nil {
				errs = append(errs, err)
			}
		}
		for i := range services {
			add(t.UpdateService(&services[i]))
		}
		for i := range slices {
			add(t.UpdateEndpointSlice(&slices[i]))
		}
		for i := range nodes {
			add(t.UpdateNode(&nodes[i]))
		}
		for i := range cidrs {
			add(t.UpdateServiceCIDR(&cidrs[i]))
		}
		return errs
	}
	return in, nil
}

// listAll lists every object of a kind, page by page.
func listAll[T any](ctx context.Context, list func(metav1.ListOptions) ([]T, string, error)) ([]T, error) {
	var out []T
	opts := metav1.ListOptions{Limit: listPage}
	for {
		items, next, err := list(opts)
		if err != nil {
			return nil, err
		}
		out = append(out, items...)
		if next == "" {
			return out, nil
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		opts.Continue = next
	}
}
