package features

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	yaml "go.yaml.in/yaml/v3"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftproxy/nftproxy/packet"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
)

// Scenario is one feature file: a node, a proxier config, the cluster objects and
// the steps to run against them.
type Scenario struct {
	// File is the path the scenario was loaded from.
	File string
	// Feature is the main Ginkgo label (clusterip, nodeport, etp-local, ...).
	Feature string
	// Labels are further Ginkgo labels.
	Labels []string
	// Pins says in one line which Kubernetes behaviour the scenario pins.
	Pins string
	// Node is the node the proxier runs on.
	Node NodeSpec
	// Config is the proxier configuration, defaulted and validated: the config
	// section is ruleset.Options, resolved by Options.Config as the daemon's is.
	Config ruleset.Config
	// Warnings say what the config leaves unset (ruleset.Options.Config), for the
	// runner to print.
	Warnings []string
	// Cluster is the initial cluster: Kubernetes YAML (Services, EndpointSlices, Node).
	Cluster Docs
	// Steps run in order.
	Steps []*Step
}

// NodeSpec describes the node a scenario runs on.
type NodeSpec struct {
	Name      string       `yaml:"name"`
	Addresses []netip.Addr `yaml:"addresses"`
	Zone      string       `yaml:"zone"`
	// PodCIDRs are the node's own pod ranges; other pods are on remote nodes.
	PodCIDRs []netip.Prefix `yaml:"podCIDRs"`
}

// Docs is Kubernetes YAML embedded in a scenario, with the line it starts on.
type Docs struct {
	Text string
	Line int
}

// ObjectRef names an object to delete: "Service default/web" or
// "EndpointSlice default/web-abc".
type ObjectRef struct {
	Kind      string
	Namespace string
	Name      string
}

// Step is one action of a scenario: a packet and its expected outcome, an update or
// deletion of cluster objects, the passing of time, or a full resync.
type Step struct {
	// Line is the step's line in the scenario file.
	Line int
	// Name describes the step (optional in the file; derived from the packet).
	Name string

	// Packet is sent when not nil, from the place From names.
	Packet *packet.Packet
	From   Origin
	Expect *Expect

	// Update holds objects to create or replace.
	Update *Docs
	// Delete lists objects to remove.
	Delete []ObjectRef
	// Advance lets time pass (session affinity timeouts).
	Advance time.Duration
	// Resync runs the periodic full sync, which rewrites every table, or writes
	// only what changed when the nf_tables generation shows nothing else wrote
	// (syncer.Generations; the kernel's tables only).
	Resync bool
}

// Origin is where a packet comes from.
type Origin string

// The places packets come from.
const (
	// FromPod is a pod on this node (arriving on a pod interface).
	FromPod Origin = "pod"
	// FromRemotePod is a pod on another node (arriving from the cluster network).
	FromRemotePod Origin = "remote-pod"
	// FromNode is the node itself (the output path).
	FromNode Origin = "node"
	// FromExternal is a client outside the cluster (arriving on the node's uplink).
	FromExternal Origin = "external"
)

// Expect is what must happen to a packet. Exactly one of Endpoints, Verdict drop or
// reject, Local or Unhandled is set.
type Expect struct {
	// Endpoints is the exact set of endpoints (addr:port) the packet may be DNATed to.
	Endpoints []netip.AddrPort
	// Drop and Reject expect the packet to be dropped or rejected.
	Drop, Reject bool
	// Local expects delivery to the node itself without DNAT.
	Local bool
	// Unhandled expects the packet to pass untouched: accepted, not DNATed.
	Unhandled bool
	// Masquerade, when set, is whether the packet must be masqueraded.
	Masquerade *bool
	// Source, when set, is the source address the endpoint sees.
	Source *netip.Addr
	// Sticky expects the same endpoint the previous packet from the same client
	// address was sent to.
	Sticky bool
}

// String describes the expectation in the scenario's own words.
func (e *Expect) String() string {
	var parts []string
	switch {
	case len(e.Endpoints) > 0:
		var eps []string
		for _, ep := range e.Endpoints {
			eps = append(eps, ep.String())
		}
		parts = append(parts, "endpoints "+strings.Join(eps, ", "))
	case e.Drop:
		parts = append(parts, "DROP")
	case e.Reject:
		parts = append(parts, "REJECT")
	case e.Local:
		parts = append(parts, "delivered to the node")
	case e.Unhandled:
		parts = append(parts, "not handled")
	}
	if e.Masquerade != nil {
		if *e.Masquerade {
			parts = append(parts, "masqueraded")
		} else {
			parts = append(parts, "not masqueraded")
		}
	}
	if e.Source != nil {
		parts = append(parts, "endpoint sees "+e.Source.String())
	}
	if e.Sticky {
		parts = append(parts, "same endpoint as before")
	}
	return strings.Join(parts, ", ")
}

// raw types mirror the file format; yaml.v3 decodes them strictly.
type rawScenario struct {
	Feature string      `yaml:"feature"`
	Labels  []string    `yaml:"labels"`
	Pins    string      `yaml:"pins"`
	Node    NodeSpec    `yaml:"node"`
	Config  yaml.Node   `yaml:"config"`
	Cluster yaml.Node   `yaml:"cluster"`
	Steps   []yaml.Node `yaml:"steps"`
}

type rawStep struct {
	Name    string     `yaml:"name"`
	Packet  string     `yaml:"packet"`
	From    string     `yaml:"from"`
	Expect  *rawExpect `yaml:"expect"`
	Update  yaml.Node  `yaml:"update"`
	Delete  []string   `yaml:"delete"`
	Advance string     `yaml:"advance"`
	Resync  bool       `yaml:"resync"`
}

type rawExpect struct {
	Endpoints  []string `yaml:"endpoints"`
	Verdict    string   `yaml:"verdict"`
	Masquerade *bool    `yaml:"masquerade"`
	Source     string   `yaml:"source"`
	Sticky     bool     `yaml:"sticky"`
}

// LoadDir loads every *.yaml scenario below dir, sorted by path.
func LoadDir(dir string) ([]*Scenario, error) {
	var files []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".yaml") && !strings.Contains(path, "testdata") {
			files = append(files, path)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	var out []*Scenario
	var errs []error
	for _, f := range files {
		sc, err := LoadFile(f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, sc)
	}
	return out, errors.Join(errs...)
}

// LoadFile loads one scenario file.
func LoadFile(path string) (*Scenario, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(data, path)
}

// lineError is an error at a line of a scenario file.
func lineError(file string, line int, format string, args ...any) error {
	return fmt.Errorf("%s:%d: %s", file, line, fmt.Sprintf(format, args...))
}

// Parse parses a scenario. Every error names the file, the line and the field.
func Parse(data []byte, file string) (*Scenario, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var raw rawScenario
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	sc := &Scenario{File: file, Feature: raw.Feature, Labels: raw.Labels, Pins: raw.Pins, Node: raw.Node}
	if sc.Feature == "" {
		return nil, lineError(file, 1, "field feature: missing")
	}
	if sc.Pins == "" {
		return nil, lineError(file, 1, "field pins: missing (say which Kubernetes behaviour the scenario pins)")
	}
	if sc.Node.Name == "" {
		sc.Node.Name = "node-a"
	}
	cfg, warnings, err := scenarioConfig(&raw.Config)
	if err != nil {
		return nil, lineError(file, raw.Config.Line, "config: %v", err)
	}
	sc.Config, sc.Warnings = cfg, warnings
	if raw.Cluster.Kind == 0 {
		return nil, lineError(file, 1, "field cluster: missing")
	}
	sc.Cluster, err = docs(file, "cluster", &raw.Cluster)
	if err != nil {
		return nil, err
	}
	for i := range raw.Steps {
		st, err := parseStep(file, sc, &raw.Steps[i])
		if err != nil {
			return nil, err
		}
		sc.Steps = append(sc.Steps, st)
	}
	if len(sc.Steps) == 0 {
		return nil, lineError(file, 1, "field steps: no steps")
	}
	// The cluster must load without errors: a scenario states a valid cluster.
	if _, err := sc.Tracker(); err != nil {
		return nil, err
	}
	return sc, nil
}

func docs(file, field string, n *yaml.Node) (Docs, error) {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
		return Docs{}, lineError(file, n.Line, "field %s: want a block of Kubernetes YAML (%s: |)", field, field)
	}
	// A literal block starts on the line after its indicator.
	return Docs{Text: n.Value, Line: n.Line + 1}, nil
}

// scenarioConfig decodes the config section as ruleset.Options, strictly, and
// resolves it with the defaults and validation every program shares.
func scenarioConfig(n *yaml.Node) (ruleset.Config, []string, error) {
	var o ruleset.Options
	if n.Kind != 0 {
		data, err := yaml.Marshal(n)
		if err != nil {
			return ruleset.Config{}, nil, err
		}
		if o, err = ruleset.DecodeOptions(data); err != nil {
			return ruleset.Config{}, nil, err
		}
	}
	return o.Config()
}

func parseStep(file string, sc *Scenario, n *yaml.Node) (*Step, error) {
	var raw rawStep
	if err := n.Decode(&raw); err != nil {
		return nil, fmt.Errorf("%s: step at line %d: %w", file, n.Line, err)
	}
	st := &Step{Line: n.Line, Name: raw.Name}
	kinds := 0
	if raw.Packet != "" {
		kinds++
		p, err := packet.Parse(raw.Packet)
		if err != nil {
			return nil, lineError(file, n.Line, "field packet: %v", err)
		}
		st.Packet = &p
		st.From, err = origin(raw.From, p, sc)
		if err != nil {
			return nil, lineError(file, n.Line, "field from: %v", err)
		}
		if raw.Expect == nil {
			return nil, lineError(file, n.Line, "field expect: missing for packet %q", raw.Packet)
		}
		st.Expect, err = raw.Expect.parse()
		if err != nil {
			return nil, lineError(file, n.Line, "field expect: %v", err)
		}
		if st.Name == "" {
			st.Name = fmt.Sprintf("%s from %s: %s", raw.Packet, st.From, st.Expect)
		}
	} else if raw.Expect != nil || raw.From != "" {
		return nil, lineError(file, n.Line, "fields expect/from need a packet")
	}
	if raw.Update.Kind != 0 {
		kinds++
		d, err := docs(file, "update", &raw.Update)
		if err != nil {
			return nil, err
		}
		st.Update = &d
		if st.Name == "" {
			st.Name = "update objects"
		}
	}
	if len(raw.Delete) > 0 {
		kinds++
		for _, r := range raw.Delete {
			ref, err := parseRef(r)
			if err != nil {
				return nil, lineError(file, n.Line, "field delete: %v", err)
			}
			st.Delete = append(st.Delete, ref)
		}
		if st.Name == "" {
			st.Name = "delete " + strings.Join(raw.Delete, ", ")
		}
	}
	if raw.Advance != "" {
		kinds++
		d, err := time.ParseDuration(raw.Advance)
		if err != nil || d <= 0 {
			return nil, lineError(file, n.Line, "field advance: %q is not a positive duration", raw.Advance)
		}
		st.Advance = d
		if st.Name == "" {
			st.Name = "wait " + raw.Advance
		}
	}
	if raw.Resync {
		kinds++
		st.Resync = true
		if st.Name == "" {
			st.Name = "periodic full resync"
		}
	}
	if kinds != 1 {
		return nil, lineError(file, n.Line, "a step has exactly one of packet, update, delete, advance, resync (found %d)", kinds)
	}
	return st, nil
}

func (r *rawExpect) parse() (*Expect, error) {
	e := &Expect{Masquerade: r.Masquerade, Sticky: r.Sticky}
	for _, s := range r.Endpoints {
		ap, err := netip.ParseAddrPort(s)
		if err != nil {
			return nil, fmt.Errorf("endpoints: %q is not addr:port", s)
		}
		e.Endpoints = append(e.Endpoints, ap)
	}
	switch r.Verdict {
	case "":
	case "drop":
		e.Drop = true
	case "reject":
		e.Reject = true
	case "local":
		e.Local = true
	case "unhandled":
		e.Unhandled = true
	default:
		return nil, fmt.Errorf("verdict: %q: want drop, reject, local or unhandled", r.Verdict)
	}
	if (len(e.Endpoints) > 0) == (r.Verdict != "") {
		return nil, errors.New("give either endpoints or a verdict")
	}
	if r.Source != "" {
		a, err := netip.ParseAddr(r.Source)
		if err != nil {
			return nil, fmt.Errorf("source: %q is not an address", r.Source)
		}
		e.Source = &a
	}
	if (e.Masquerade != nil || e.Source != nil || e.Sticky) && len(e.Endpoints) == 0 {
		return nil, errors.New("masquerade, source and sticky need endpoints")
	}
	return e, nil
}

func parseRef(s string) (ObjectRef, error) {
	kind, nn, ok := strings.Cut(strings.TrimSpace(s), " ")
	ns, name, ok2 := strings.Cut(strings.TrimSpace(nn), "/")
	if !ok || !ok2 || ns == "" || name == "" || (kind != state.KindService && kind != state.KindEndpointSlice) {
		return ObjectRef{}, fmt.Errorf("%q: want \"Service ns/name\" or \"EndpointSlice ns/name\"", s)
	}
	return ObjectRef{Kind: kind, Namespace: ns, Name: name}, nil
}

// origin resolves where a packet comes from: given, or inferred from its source
// address (a node address: the node; the node's pod CIDRs: a pod; another pod
// address in the cluster CIDRs: a remote pod; anything else: external).
func origin(given string, p packet.Packet, sc *Scenario) (Origin, error) {
	switch o := Origin(given); o {
	case FromPod, FromRemotePod, FromNode, FromExternal:
		return o, nil
	case "":
	default:
		return "", fmt.Errorf("%q: want pod, remote-pod, node or external", given)
	}
	src := p.Src.Addr()
	for _, a := range sc.Node.Addresses {
		if a == src {
			return FromNode, nil
		}
	}
	for _, c := range sc.Node.PodCIDRs {
		if c.Contains(src) {
			return FromPod, nil
		}
	}
	for _, c := range sc.Config.ClusterCIDRs {
		if c.Contains(src) {
			return FromRemotePod, nil
		}
	}
	return FromExternal, nil
}

// Tracker returns a Tracker holding the scenario's node and initial cluster.
func (sc *Scenario) Tracker() (*state.Tracker, error) {
	t := state.NewTracker(sc.Node.Name)
	if err := sc.Load(t); err != nil {
		return nil, err
	}
	return t, nil
}

// Load records the scenario's node and initial cluster in t.
func (sc *Scenario) Load(t *state.Tracker) error {
	if err := t.UpdateNode(sc.nodeObject()); err != nil {
		return fmt.Errorf("%s: node: %w", sc.File, err)
	}
	return sc.Apply(t, sc.Cluster)
}

// Apply records the objects of d in t. Any error (also a single invalid object) fails
// the scenario: a scenario states valid objects.
func (sc *Scenario) Apply(t *state.Tracker, d Docs) error {
	objErrs, err := t.ApplyYAML([]byte(d.Text), sc.File)
	if err != nil {
		return shiftLines(err, d.Line-1)
	}
	var errs []error
	for _, e := range objErrs {
		errs = append(errs, shiftLines(e, d.Line-1))
	}
	return errors.Join(errs...)
}

// shiftLines turns a line inside an embedded block into a line of the scenario file.
func shiftLines(err error, offset int) error {
	var de *state.DocumentError
	if errors.As(err, &de) {
		c := *de
		c.Line += offset
		return &c
	}
	return err
}

// Delete removes the referenced objects from t.
func Delete(t *state.Tracker, refs []ObjectRef) {
	for _, r := range refs {
		switch r.Kind {
		case state.KindService:
			t.DeleteService(serviceRef(r))
		case state.KindEndpointSlice:
			t.DeleteEndpointSlice(sliceRef(r))
		}
	}
}

func serviceRef(r ObjectRef) *v1.Service {
	return &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: r.Namespace, Name: r.Name}}
}

func sliceRef(r ObjectRef) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: r.Namespace, Name: r.Name}}
}

// nodeObject is the scenario's node as a Kubernetes Node.
func (sc *Scenario) nodeObject() *v1.Node {
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: sc.Node.Name}}
	if sc.Node.Zone != "" {
		n.Labels = map[string]string{v1.LabelTopologyZone: sc.Node.Zone}
	}
	for _, a := range sc.Node.Addresses {
		n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: v1.NodeInternalIP, Address: a.String()})
	}
	return n
}
