package cluster

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Creating a random set in the cluster, waiting until both compared proxies have
// programmed it, and removing it again.

// zoneLabel is the Node label topology reads the zone from.
const zoneLabel = "topology.kubernetes.io/zone"

// zoned puts every node of nodes in a zone of its own, so that zone hints single out
// the compared nodes' own (twin) endpoints alike. The zones are the Nodes' labels from
// their registration, before the proxies start: kube-proxy, labelled after its start,
// was seen to keep ignoring the hints for want of its node's zone.
func zoned(nodes []NodeSpec) []NodeSpec {
	for i := range nodes {
		nodes[i].Labels = map[string]string{zoneLabel: "zone-" + nodes[i].Name}
	}
	return nodes
}

// applied is a random set as created in the cluster.
type applied struct {
	set *peerSet
	// twins[i] are the twin i's pods on the compared nodes a and b; others are on the
	// third node.
	twins  [][2]*Pod
	others []*Pod
	// services are the created Services (with their ClusterIPs and node ports), by name.
	services map[string]*v1.Service
}

// applySet creates the pods of s (twin i on a, then on b, so that both nodes number
// them alike) and puts them in their states, then creates the Services and writes the
// load balancers' status.
func applySet(ctx context.Context, c *Cluster, a, b, other *Node, s *peerSet) (*applied, error) {
	ap := &applied{set: s, services: map[string]*v1.Service{}}
	for _, tw := range s.twins {
		var pair [2]*Pod
		for i, n := range []*Node{a, b} {
			p, err := addPeerPod(ctx, c, n, tw, fmt.Sprintf("%s-%c", tw.name, 'a'+i))
			if err != nil {
				return ap, err
			}
			pair[i] = p
		}
		ap.twins = append(ap.twins, pair)
	}
	for _, o := range s.others {
		p, err := addPeerPod(ctx, c, other, o, o.name)
		if err != nil {
			return ap, err
		}
		ap.others = append(ap.others, p)
	}
	for _, svc := range s.services {
		var created *v1.Service
		err := waitFor(ctx, defaultWait, "create service default/"+svc.Name, func() (bool, error) {
			var err error
			created, err = c.Client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
			return err == nil, err
		})
		if err != nil {
			return ap, err
		}
		if ing := s.ingress[svc.Name]; ing != nil {
			created.Status.LoadBalancer.Ingress = ing
			if created, err = c.Client.CoreV1().Services("default").UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
				return ap, fmt.Errorf("service default/%s: load balancer status: %w", svc.Name, err)
			}
		}
		ap.services[svc.Name] = created
	}
	// The allocator picks ClusterIPs at random: step over any that took the address.
	for _, un := range []*netip.Addr{&s.unallocated, &s.unallocated6} {
		for un.IsValid() && slices.ContainsFunc(slices.Collect(maps.Values(ap.services)), func(svc *v1.Service) bool {
			return slices.Contains(svc.Spec.ClusterIPs, un.String())
		}) {
			*un = un.Next()
		}
	}
	return ap, nil
}

// addPeerPod adds pod pp to node n under name and puts it in its state.
func addPeerPod(ctx context.Context, c *Cluster, n *Node, pp peerPod, name string) (*Pod, error) {
	p, err := c.AddPod(ctx, PodSpec{Name: name, Node: n.Spec.Name, Labels: pp.labels, DeclaredPorts: pp.declared})
	if err != nil {
		return nil, err
	}
	if pp.state == podNotReady || pp.state == podTerminatingNotReady {
		if err := setUnready(ctx, c, p); err != nil {
			return p, err
		}
	}
	if pp.state == podTerminating || pp.state == podTerminatingNotReady {
		// Long enough to outlast the set: the pod stays terminating until removeSet.
		if err := c.Terminate(ctx, p, 10*time.Minute); err != nil {
			return p, err
		}
	}
	return p, nil
}

// setUnready writes the pod's Ready condition false, as a kubelet whose readiness probe
// fails does.
func setUnready(ctx context.Context, c *Cluster, p *Pod) error {
	pods := c.Client.CoreV1().Pods(p.Spec.Namespace)
	obj, err := pods.Get(ctx, p.Spec.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("pod %s/%s: %w", p.Spec.Namespace, p.Spec.Name, err)
	}
	for i, cond := range obj.Status.Conditions {
		if cond.Type == v1.PodReady || cond.Type == v1.ContainersReady {
			obj.Status.Conditions[i].Status = v1.ConditionFalse
			obj.Status.Conditions[i].LastTransitionTime = metav1.Now()
		}
	}
	for i := range obj.Status.ContainerStatuses {
		obj.Status.ContainerStatuses[i].Ready = false
	}
	if _, err := pods.UpdateStatus(ctx, obj, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("pod %s/%s: status not ready: %w", p.Spec.Namespace, p.Spec.Name, err)
	}
	return nil
}

// wantEndpoints is what the EndpointSlice controller writes for svc: its selected pods
// with their conditions, as endpointConditions reports them.
func (ap *applied) wantEndpoints(svc *v1.Service) map[string]string {
	want := map[string]string{}
	if svc.Spec.Selector == nil {
		return want
	}
	sel := labels.SelectorFromSet(svc.Spec.Selector)
	add := func(pp peerPod, names ...string) {
		if !sel.Matches(labels.Set(pp.labels)) {
			return
		}
		serving := pp.state == podReady || pp.state == podTerminating
		terminating := pp.state == podTerminating || pp.state == podTerminatingNotReady
		ready := svc.Spec.PublishNotReadyAddresses || (serving && !terminating)
		conds := map[bool]string{true: "R", false: "-"}[ready] + map[bool]string{true: "S", false: "-"}[serving] +
			map[bool]string{true: "T", false: "-"}[terminating]
		for _, n := range names {
			want[n] = conds
		}
	}
	for _, tw := range ap.set.twins {
		add(tw, tw.name+"-a", tw.name+"-b")
	}
	for _, o := range ap.set.others {
		add(o, o.name)
	}
	return want
}

// waitProgrammed waits until the controller has written every Service's endpoints,
// then until the rulesets of nodes have not changed for settle (both proxies batch
// changes for their minimum sync period, 1s).
func (ap *applied) waitProgrammed(ctx context.Context, c *Cluster, settle time.Duration, nodes ...*Node) error {
	for _, svc := range ap.set.services {
		want := ap.wantEndpoints(svc)
		var got map[string]string
		err := waitFor(ctx, defaultWait, "endpoints of default/"+svc.Name, func() (bool, error) {
			var err error
			got, err = endpointConditions(ctx, c, svc.Name)
			return maps.Equal(got, want), err
		})
		if err != nil {
			return fmt.Errorf("%w: want %v, last seen %v", err, want, got)
		}
	}
	return waitRulesets(ctx, settle, ap.missingFrom, nodes...)
}

// waitRulesets waits until the rulesets of nodes have not changed for settle and
// missing (naming what a ruleset lacks, "" when nothing) is content with each. It
// compares the stateless listings: counters and the expiry of affinity entries change
// with every listing while traffic has crossed the node.
func waitRulesets(ctx context.Context, settle time.Duration, missing func(ruleset string) string, nodes ...*Node) error {
	last := make([]string, len(nodes))
	since := time.Now()
	return waitFor(ctx, 2*defaultWait, "rulesets settle", func() (bool, error) {
		changed := false
		for i, n := range nodes {
			text, err := n.StatelessRuleset(ctx)
			if err != nil {
				return false, err
			}
			if text != last[i] {
				last[i], changed = text, true
			}
			if m := missing(text); m != "" {
				return false, fmt.Errorf("node %s has no rules for %s yet", n.Spec.Name, m)
			}
		}
		if changed {
			since = time.Now()
		}
		return time.Since(since) >= settle, nil
	})
}

// hints counts the endpoints of the set's slices that the controller hinted for a zone
// and for a node: topology the comparison must have covered.
func (ap *applied) hints(ctx context.Context, c *Cluster) (zones, nodes int, err error) {
	list, err := c.Client.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, 0, fmt.Errorf("list endpointslices: %w", err)
	}
	for _, s := range list.Items {
		if ap.services[s.Labels[discoveryv1.LabelServiceName]] == nil {
			continue
		}
		for _, ep := range s.Endpoints {
			if ep.Hints != nil && len(ep.Hints.ForZones) > 0 {
				zones++
			}
			if ep.Hints != nil && len(ep.Hints.ForNodes) > 0 {
				nodes++
			}
		}
	}
	return zones, nodes, nil
}

// missingFrom names a Service of the set whose ClusterIP a ruleset lacks, or returns "".
func (ap *applied) missingFrom(ruleset string) string {
	for name, svc := range ap.services {
		if !strings.Contains(ruleset, svc.Spec.ClusterIP) {
			return "service default/" + name
		}
	}
	return ""
}

// removeSet deletes the set's Services and removes its pods.
func removeSet(ctx context.Context, c *Cluster, ap *applied) error {
	var errs []error
	for name := range ap.services {
		errs = append(errs, c.Client.CoreV1().Services("default").Delete(ctx, name, metav1.DeleteOptions{}))
	}
	for _, pair := range ap.twins {
		errs = append(errs, c.Remove(ctx, pair[0]), c.Remove(ctx, pair[1]))
	}
	for _, p := range ap.others {
		errs = append(errs, c.Remove(ctx, p))
	}
	return errors.Join(errs...)
}
