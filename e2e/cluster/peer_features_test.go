package cluster

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/nftproxy/nftproxy/features"
	"github.com/nftproxy/nftproxy/packet"
)

// Replaying the feature scenarios (features/**/*.yaml) in the cluster: their Services
// and EndpointSlices (selector-less, written through the API) and their packets, traced
// on both compared nodes as the random sets' are. A scenario's world has one node; the
// lab has two compared ones, so everything of the scenario's node is translated twice:
// its addresses to each compared node's, its pods (endpoints on it, pod sources) to a
// twin in each node's pod CIDR, its zone and node name in hints to each node's. Pods of
// other nodes go to node-c's pod CIDR. Service addresses, node ports and object names
// are renamed per scenario, so that every scenario lives in the cluster at once and its
// steps run in lockstep with the others'. The scenario's expectations are not used (its
// config is not the lab's): only the two proxies' outcomes are compared. IPv6 objects
// and packets are left out unless the cluster is dual-stack.

// peerManagedBy marks the EndpointSlices the replay writes: the EndpointSlice
// controller leaves slices of other managers alone.
const peerManagedBy = "peer-conformance.nftproxy.io"

// replay is a scenario translated to the lab.
type replay struct {
	sc     *features.Scenario
	index  int
	phases []replayPhase
	// failed says why the cluster refused the scenario's objects; its packets are then
	// not compared.
	failed error
	tr     *translator
	// live are the translated names of the scenario's Services, for ruleset checks.
	live map[string]*v1.Service
}

// replayPhase is the objects a phase changes (its first step), and its packets.
type replayPhase struct {
	update  *features.Docs
	deletes []features.ObjectRef
	packets []*features.Step
}

func newReplay(c *Cluster, sc *features.Scenario, index int, hosts *int) *replay {
	r := &replay{sc: sc, index: index, tr: newTranslator(c, sc, index, hosts), live: map[string]*v1.Service{}}
	r.phases = []replayPhase{{update: &sc.Cluster}}
	for _, st := range sc.Steps {
		switch {
		case st.Update != nil:
			r.phases = append(r.phases, replayPhase{update: st.Update})
		case len(st.Delete) > 0:
			r.phases = append(r.phases, replayPhase{deletes: st.Delete})
		case st.Packet != nil && (st.Packet.Family() == packet.IPv4 || c.Spec.DualStack):
			last := &r.phases[len(r.phases)-1]
			last.packets = append(last.packets, st)
		}
		// Advance and resync change nothing for traces that start from a fresh state.
	}
	return r
}

// apply makes phase k's changes in the cluster.
func (r *replay) apply(ctx context.Context, c *Cluster, k int) error {
	ph := r.phases[k]
	var errs []error
	for _, ref := range ph.deletes {
		name := r.tr.name(ref.Namespace, ref.Name)
		var err error
		switch ref.Kind {
		case "Service":
			err = c.Client.CoreV1().Services("default").Delete(ctx, name, metav1.DeleteOptions{})
			delete(r.live, name)
		case "EndpointSlice":
			err = c.Client.DiscoveryV1().EndpointSlices("default").Delete(ctx, name, metav1.DeleteOptions{})
		}
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete %s %s: %w", ref.Kind, name, err))
		}
	}
	if ph.update == nil {
		return errors.Join(errs...)
	}
	objs, err := decodeDocs(ph.update.Text)
	if err != nil {
		return err
	}
	for _, obj := range objs {
		switch o := obj.(type) {
		case *v1.Service:
			if svc := r.tr.service(o); svc != nil {
				errs = append(errs, r.putService(ctx, c, svc))
			}
		case *discoveryv1.EndpointSlice:
			if o.AddressType == discoveryv1.AddressTypeIPv4 || o.AddressType == discoveryv1.AddressTypeIPv6 && c.Spec.DualStack {
				errs = append(errs, putSlice(ctx, c, r.tr.slice(o)))
			}
		} // Nodes and ServiceCIDRs: the lab has its own.
	}
	return errors.Join(errs...)
}

// putService creates or replaces svc, then writes its load balancer status.
func (r *replay) putService(ctx context.Context, c *Cluster, svc *v1.Service) error {
	svcs := c.Client.CoreV1().Services("default")
	status := svc.Status
	// Get first: a Create of an existing Service fails on its ClusterIP, taken.
	got, err := svcs.Get(ctx, svc.Name, metav1.GetOptions{})
	switch {
	case err == nil:
		svc.ResourceVersion = got.ResourceVersion
		got, err = svcs.Update(ctx, svc, metav1.UpdateOptions{})
	case apierrors.IsNotFound(err):
		got, err = svcs.Create(ctx, svc, metav1.CreateOptions{})
	}
	if err == nil && len(status.LoadBalancer.Ingress) > 0 {
		got.Status = status
		got, err = svcs.UpdateStatus(ctx, got, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("service default/%s: %w", svc.Name, err)
	}
	r.live[svc.Name] = got
	return nil
}

func putSlice(ctx context.Context, c *Cluster, s *discoveryv1.EndpointSlice) error {
	slices := c.Client.DiscoveryV1().EndpointSlices("default")
	_, err := slices.Create(ctx, s, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		var old *discoveryv1.EndpointSlice
		if old, err = slices.Get(ctx, s.Name, metav1.GetOptions{}); err == nil {
			s.ResourceVersion = old.ResourceVersion
			_, err = slices.Update(ctx, s, metav1.UpdateOptions{})
		}
	}
	if err != nil {
		return fmt.Errorf("endpointslice default/%s: %w", s.Name, err)
	}
	return nil
}

// decodeDocs decodes multi-document Kubernetes YAML.
func decodeDocs(text string) ([]runtime.Object, error) {
	rd := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(text)))
	var out []runtime.Object
	for {
		doc, err := rd.Read()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("decoding %q: %w", firstLine(doc), err)
		}
		out = append(out, obj)
	}
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return s
}

// missingFrom names a Service of the replay that a proxy must program (it has a
// ClusterIP, and no service-proxy-name or headless label, whatever their value) whose
// ClusterIP the ruleset lacks, or "".
func (r *replay) missingFrom(ruleset string) string {
	for name, svc := range r.live {
		ip := svc.Spec.ClusterIP
		_, otherProxy := svc.Labels["service.kubernetes.io/service-proxy-name"]
		_, headless := svc.Labels[v1.IsHeadlessService]
		if ip == "" || ip == v1.ClusterIPNone || otherProxy || headless {
			continue
		}
		if !strings.Contains(ruleset, ip) {
			return "service default/" + name
		}
	}
	return ""
}

// replayFeatures replays every feature scenario, all at once and their phases in
// lockstep, and compares their packets on the compared nodes a and b.
func replayFeatures(ctx context.Context, t *testing.T, c *Cluster, a, b *Node, tally *peerTally) {
	scs, err := features.LoadDir(filepath.Join(repoRoot, "features"))
	if err != nil {
		t.Fatal(err)
	}
	rs, phases := newReplays(c, scs)
	compared, kinds := 0, map[string]int{}
	for k := range phases {
		if err := applyPhase(ctx, t, c, rs, k, a, b); err != nil {
			t.Fatalf("feature scenarios, phase %d: %v", k, err)
		}
		va, err := liveView(ctx, a, 0, c)
		if err != nil {
			t.Fatal(err)
		}
		vb, err := liveView(ctx, b, 1, c)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			if r.failed == nil && k < len(r.phases) {
				compared += r.compare(t, r.phases[k].packets, va, vb, tally, kinds)
			}
		}
	}
	replayed := 0
	for _, r := range rs {
		if r.failed == nil {
			replayed++
		}
	}
	tally.scenarios += replayed
	t.Logf("feature scenarios: %d of %d replayed, %d packets compared; kube-proxy's outcomes: %v", replayed, len(rs), compared, kinds)
}

// origins are the probe sources of the scenarios' packet origins, for explanations.
var origins = map[features.Origin]string{features.FromPod: srcPod, features.FromRemotePod: srcRemote,
	features.FromNode: srcNode, features.FromExternal: srcAllowed}

// compare traces the packet steps on both views and counts them in tally.
// kinds counts kube-proxy's outcomes by outcomeKinds.
func (r *replay) compare(t *testing.T, steps []*features.Step, va, vb *peerView, tally *peerTally, kinds map[string]int) int {
	for _, st := range steps {
		pa, pb := r.tr.packet(st, 0, va.node), r.tr.packet(st, 1, vb.node)
		on, err := va.classOf(pa)
		if err == nil {
			var ok string
			if ok, err = vb.classOf(pb); err == nil {
				for _, kind := range outcomeKinds {
					if strings.Contains(ok, kind) {
						kinds[kind]++
					}
				}
				pr := r.probeOf(st, pa, va)
				tally.count(pr, on, ok, func() {
					t.Errorf("unexplained difference: %s line %d (%s)\n  nftproxy   (%s): %s\n  kube-proxy (%s): %s",
						r.sc.File, st.Line, st.Name, pa, on, pb, ok)
				})
			}
		}
		if err != nil {
			t.Errorf("%s line %d: %v", r.sc.File, st.Line, err)
		}
	}
	return len(steps)
}

// probeOf is the probe of a scenario packet p on view v, as far as explanations need it:
// its source, and the Service whose load-balancer IP it is sent to.
func (r *replay) probeOf(st *features.Step, p packet.Packet, v *peerView) probe {
	pr := probe{src: origins[st.From], srcName: v.name(p.Src.Addr()), six: p.Src.Addr().Is6()}
	for _, svc := range r.live {
		for _, ing := range svc.Status.LoadBalancer.Ingress {
			if ing.IP == p.Dst.Addr().String() {
				pr.svc, pr.dst = svc, dstIngress
			}
		}
	}
	return pr
}

// applyPhase applies phase k of every replay still going (a replay the API refused is
// logged and left out from then on) and waits until both nodes' rulesets hold it.
func applyPhase(ctx context.Context, t *testing.T, c *Cluster, rs []*replay, k int, a, b *Node) error {
	for _, r := range rs {
		if r.failed == nil && k < len(r.phases) {
			if r.failed = r.apply(ctx, c, k); r.failed != nil {
				t.Logf("%s: not replayed: %v", r.sc.File, r.failed)
			}
		}
	}
	missing := func(text string) string {
		for _, r := range rs {
			if m := r.missingFrom(text); r.failed == nil && m != "" {
				return r.sc.File + ": " + m
			}
		}
		return ""
	}
	return waitRulesets(ctx, 3*time.Second, missing, a, b)
}

// newReplays makes the replays of scs, their hosts numbered from 60 on, and returns how
// many phases the longest has.
func newReplays(c *Cluster, scs []*features.Scenario) ([]*replay, int) {
	hosts, phases := 60, 0
	var rs []*replay
	for i, sc := range scs {
		r := newReplay(c, sc, i, &hosts)
		rs = append(rs, r)
		phases = max(phases, len(r.phases))
	}
	return rs, phases
}
