package state

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	networkingv1 "k8s.io/api/networking/v1"
)

// ConvertServiceCIDR validates c, a networking.k8s.io/v1 ServiceCIDR, and returns
// its spec.cidrs: the ranges ClusterIPs are allocated from, masked. kube-proxy uses
// every ServiceCIDR its informer lists, whatever its conditions, and so do we. A
// malformed ServiceCIDR yields an *ObjectError listing every invalid field.
func ConvertServiceCIDR(c *networkingv1.ServiceCIDR) ([]netip.Prefix, error) {
	if c == nil {
		return nil, nil
	}
	var fe fieldErrors
	if c.Name == "" {
		fe.addMsg("metadata.name", "required")
	}
	if len(c.Spec.CIDRs) > 2 {
		fe.add("spec.cidrs", fmt.Errorf("%d CIDRs, at most one per family is allowed", len(c.Spec.CIDRs)))
	}
	var out []netip.Prefix
	for i, s := range c.Spec.CIDRs {
		path := fmt.Sprintf("spec.cidrs[%d]", i)
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			fe.add(path, fmt.Errorf("invalid CIDR: %w", err))
			continue
		}
		if p.Addr().Is4In6() || p.Addr().Zone() != "" {
			fe.add(path, fmt.Errorf("invalid CIDR %q: IPv4-mapped addresses and zones are not allowed", s))
			continue
		}
		if j := slices.IndexFunc(out, func(q netip.Prefix) bool { return q.Addr().Is4() == p.Addr().Is4() }); j >= 0 {
			fe.add(path, fmt.Errorf("%s is of the same family as %s", p, out[j]))
			continue
		}
		out = append(out, p.Masked())
	}
	if err := fe.objectError(KindServiceCIDR, "", c.Name); err != nil {
		return nil, err
	}
	return out, nil
}

// UpdateServiceCIDR records an added or updated ServiceCIDR. A malformed one is
// removed, and its error is returned and kept until it becomes valid or is deleted.
// No Service changes: the service ranges are the table's, not a Service's.
func (t *Tracker) UpdateServiceCIDR(c *networkingv1.ServiceCIDR) error {
	if c == nil {
		return nil
	}
	cidrs, err := ConvertServiceCIDR(c)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.setError(objectKey{KindServiceCIDR, "", c.Name}, err)
	if err != nil {
		t.setServiceCIDR(c.Name, nil)
		return err
	}
	t.setServiceCIDR(c.Name, cidrs)
	return nil
}

// DeleteServiceCIDR forgets a ServiceCIDR and its error.
func (t *Tracker) DeleteServiceCIDR(c *networkingv1.ServiceCIDR) {
	if c == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.errs, objectKey{KindServiceCIDR, "", c.Name})
	t.setServiceCIDR(c.Name, nil)
}

// setServiceCIDR records the ranges of ServiceCIDR name (none: forget it) and
// recomputes their union, dropping the snapshot when the union changes.
func (t *Tracker) setServiceCIDR(name string, cidrs []netip.Prefix) {
	if len(cidrs) == 0 {
		if _, ok := t.serviceCIDRs[name]; !ok {
			return
		}
		delete(t.serviceCIDRs, name)
	} else {
		t.serviceCIDRs[name] = cidrs
	}
	union := unionPrefixes(slices.Concat(slices.Collect(maps.Values(t.serviceCIDRs))...))
	if slices.Equal(union, t.cidrUnion) {
		return
	}
	t.cidrUnion = union
	t.invalidate()
}

// unionPrefixes returns ps sorted (by address, then length) and without duplicates.
func unionPrefixes(ps []netip.Prefix) []netip.Prefix {
	if len(ps) == 0 {
		return nil
	}
	out := slices.Clone(ps)
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return slices.Compact(out)
}
