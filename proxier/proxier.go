package proxier

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/changeset"
	"github.com/nftproxy/nftproxy/proxier/conntrack"
	"github.com/nftproxy/nftproxy/proxier/health"
	"github.com/nftproxy/nftproxy/proxier/metrics"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
	"github.com/nftproxy/nftproxy/proxier/syncer"
)

// LastChangeTriggerTimeAnnotation is set by the EndpointSlice controller to the time
// of the change (of a Pod or Service) that the slice reflects.
const LastChangeTriggerTimeAnnotation = "endpoints.kubernetes.io/last-change-trigger-time"

// TaintToBeDeleted is the taint the cluster autoscaler puts on a node it is removing;
// such a node stops reporting itself eligible for load-balancer traffic.
const TaintToBeDeleted = "ToBeDeletedByClusterAutoscaler"

// NewNFTFunc returns the nftables interface of one family's table.
type NewNFTFunc func(family knftables.Family, table string) (knftables.Interface, error)

// DefaultNewNFT is knftables.New, for the kernel's nft in the current namespace. It
// lists the table's chains, sets and maps over netlink (knftables.UseNetlink): nft
// fetches every element to list a table, which takes seconds at 50,000 Services,
// while a full sync only needs the names.
func DefaultNewNFT(family knftables.Family, table string) (knftables.Interface, error) {
	return knftables.New(family, table, knftables.UseNetlink)
}

// NetlinkFunc returns the syncer.Transport that carries the netlink element
// batches of a family's table, the one nft (from NewNFT) writes.
type NetlinkFunc func(family knftables.Family, nft knftables.Interface) syncer.Transport

// KernelNetlink is the NetlinkFunc for DefaultNewNFT's tables: the kernel's
// nf_tables in the process's network namespace.
func KernelNetlink(knftables.Family, knftables.Interface) syncer.Transport {
	return syncer.KernelNetlink(nil)
}

// Families are the IP families a Proxier programs by default.
var Families = []knftables.Family{knftables.IPv4Family, knftables.IPv6Family}

// ConntrackCleaner deletes conntrack entries (conntrack.Cleaner in production).
type ConntrackCleaner interface {
	Clear(filters []conntrack.Filter) (uint, error)
}

// Config is everything a Proxier needs. Only NodeName is required.
type Config struct {
	// NodeName is this node's name: it selects the Node and the local endpoints.
	NodeName string
	// Ruleset configures the generated tables; New applies its defaults and
	// validates it.
	Ruleset ruleset.Config
	// Families are the families to program (default Families). Both are kept on a
	// single-stack cluster, as the other family's table only costs its base chains;
	// a family whose nftables cannot be opened (a kernel without IPv6) is dropped
	// with a warning, as long as one family remains.
	Families []knftables.Family
	// NewNFT opens a family's table (default DefaultNewNFT); the suites and nftrace
	// pass one that opens an in-memory table.
	NewNFT NewNFTFunc
	// Netlink, when set, makes the syncers write set and map elements as netlink
	// batches (syncer.WithNetlink) through the transport it returns for each
	// family's table: KernelNetlink with DefaultNewNFT, syncer.DecodedNetlink of
	// the same Interface with an in-memory one. Nil writes everything through
	// NewNFT's nft.
	Netlink NetlinkFunc
	// Metrics receives the proxier's metrics (default a new, unserved set).
	Metrics *metrics.Metrics
	// Healthz, when set, is told of queued changes and successful syncs, and of the
	// node's eligibility.
	Healthz *health.HealthzServer
	// ServiceHealth, when set, is synced with the health-check node ports after
	// every successful sync.
	ServiceHealth *health.ServiceHealthServer
	// Conntrack, when set, deletes stale UDP conntrack entries after every
	// successful sync.
	Conntrack ConntrackCleaner
	// OnSynced, when set, is called after each family's successful sync with the
	// ruleset its table now holds and what the sync did: the feature suites replay
	// the sync's affinity moves in the simulator's runtime, which holds the records
	// packets made, and check which writer carried each sync.
	OnSynced func(family knftables.Family, applied *ruleset.Ruleset, res syncer.Result)
	// OnChange is called after every event the proxier receives (the daemon passes
	// the runner's Run); nil means syncs happen only when Sync is called.
	OnChange func()
	// Clock is the time source (default the real clock).
	Clock clock.PassiveClock
	// Log receives the proxier's logs (default discarded).
	Log *slog.Logger
}

// Proxier keeps this node's nftables tables equal to what the cluster asks for:
// events go into a state.Tracker, and each sync builds the rulesets of every family
// from the Tracker's state and applies them with one syncer.Syncer per family.
// Its methods are safe for concurrent use; syncs are serialized.
type Proxier struct {
	cfg      Config
	tracker  *state.Tracker
	families []knftables.Family
	syncers  map[knftables.Family]*syncer.Syncer
	builders map[knftables.Family]*changeset.Builder
	// built records the families whose Builder has seen every Service.
	built   map[knftables.Family]bool
	metrics *metrics.Metrics
	// gauges keeps the state gauges' counts, updated by each successful sync.
	gauges *stateGauges
	clock  clock.PassiveClock
	log    *slog.Logger

	// started is when the Proxier was made: EndpointSlices changed before it
	// (those of the informers' first list) add no network programming latency.
	started time.Time
	// triggersMu guards the fields below, the changes received since the last
	// sync began: for each Service, the trigger times of its EndpointSlices'
	// changes, for the network programming latency; the Services changed and
	// the number of EndpointSlice changes, for the pending-changes gauges.
	triggersMu      sync.Mutex
	triggers        map[state.ServiceName][]trigger
	pendingServices map[state.ServiceName]bool
	pendingSlices   int

	// syncMu serializes syncs and guards the fields below.
	syncMu sync.Mutex
	// prior holds what the last fully successful sync applied of the Services in
	// changed (their Service and slices, absent where it had none) and that
	// sync's Node: with the state a sync applies, it is all that conntrack
	// cleanup and the state gauges diff. It is nil before the first such sync.
	prior *state.ClusterState
	// frontends follows the UDP frontends of the applied state, for conntrack
	// cleanup.
	frontends *conntrack.Frontends
	// failed is true while the last sync of some family failed.
	failed bool
	// changed accumulates the changed Services of syncs that failed, and
	// pendingTriggers their change times, until a sync succeeds.
	changed         map[state.ServiceName]bool
	pendingTriggers map[state.ServiceName][]trigger
}

// trigger is the change an EndpointSlice of a family records in its
// last-change-trigger-time.
type trigger struct {
	at     time.Time
	family knftables.Family
}

// New returns a Proxier with one nftables interface per family. It does not touch
// the kernel until the first sync.
func New(cfg Config) (*Proxier, error) {
	if cfg.NodeName == "" {
		return nil, errors.New("proxier: config: nodeName is required")
	}
	cfg.Ruleset.Defaults()
	if err := cfg.Ruleset.Validate(); err != nil {
		return nil, fmt.Errorf("proxier: %w", err)
	}
	if cfg.NewNFT == nil {
		cfg.NewNFT = DefaultNewNFT
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New()
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if len(cfg.Families) == 0 {
		cfg.Families = Families
	}
	p := &Proxier{
		cfg: cfg, tracker: state.NewTracker(cfg.NodeName), syncers: map[knftables.Family]*syncer.Syncer{},
		builders: map[knftables.Family]*changeset.Builder{}, built: map[knftables.Family]bool{},
		metrics: cfg.Metrics, clock: cfg.Clock, log: cfg.Log,
		started: cfg.Clock.Now(), triggers: map[state.ServiceName][]trigger{},
		pendingServices: map[state.ServiceName]bool{}, changed: map[state.ServiceName]bool{},
		pendingTriggers: map[state.ServiceName][]trigger{}, frontends: conntrack.NewFrontends(),
	}
	var errs []error
	// The families' tables share the node's namespace, so their Syncers follow its
	// nf_tables generation together.
	gens := syncer.NewGenerations()
	for _, fam := range cfg.Families {
		nft, err := cfg.NewNFT(fam, cfg.Ruleset.Table)
		if err != nil {
			errs = append(errs, fmt.Errorf("table %s %s: %w", fam, cfg.Ruleset.Table, err))
			continue
		}
		p.families = append(p.families, fam)
		var opts []syncer.Option
		if cfg.Netlink != nil {
			opts = append(opts, syncer.WithNetlink(cfg.Netlink(fam, nft)), syncer.WithGenerations(gens))
		}
		p.syncers[fam] = syncer.New(nft, opts...)
		p.builders[fam] = changeset.NewBuilder(cfg.Ruleset, fam)
	}
	if len(p.families) == 0 {
		return nil, fmt.Errorf("proxier: no usable IP family: %w", errors.Join(errs...))
	}
	for _, err := range errs {
		p.log.Warn("IP family disabled", "err", err)
	}
	p.metrics.Init(p.families)
	p.gauges = newStateGauges(p.families)
	if cfg.Healthz != nil {
		cfg.Healthz.SetFamilies(p.families...)
	}
	return p, nil
}

// Families returns the families the Proxier programs.
func (p *Proxier) Families() []knftables.Family { return p.families }

// Close releases the netlink sockets the Proxier's syncers keep open between
// syncs (a socket holds its network namespace). The tables stay as they are, and
// a later Sync opens new sockets.
func (p *Proxier) Close() error {
	var errs []error
	for _, fam := range p.families {
		if err := p.syncers[fam].Close(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", fam, err))
		}
	}
	return errors.Join(errs...)
}

// Tracker returns the Proxier's Tracker, for reading its state and errors.
func (p *Proxier) Tracker() *state.Tracker { return p.tracker }

// OnServiceUpdate records an added or updated Service.
func (p *Proxier) OnServiceUpdate(svc *v1.Service) {
	err := p.tracker.UpdateService(svc)
	p.serviceChanged(svc)
	p.received(state.KindService, err)
}

// OnServiceDelete records a deleted Service.
func (p *Proxier) OnServiceDelete(svc *v1.Service) {
	p.tracker.DeleteService(svc)
	p.serviceChanged(svc)
	p.received(state.KindService, nil)
}

// OnEndpointSliceUpdate records an added or updated EndpointSlice.
func (p *Proxier) OnEndpointSliceUpdate(slice *discoveryv1.EndpointSlice) {
	err := p.tracker.UpdateEndpointSlice(slice)
	p.sliceChanged(slice, triggerTime(slice))
	p.received(state.KindEndpointSlice, err)
}

// OnEndpointSliceDelete records a deleted EndpointSlice.
func (p *Proxier) OnEndpointSliceDelete(slice *discoveryv1.EndpointSlice) {
	p.tracker.DeleteEndpointSlice(slice)
	// As in kube-proxy, a deleted slice's trigger time is that of its last
	// update, not of its deletion: it adds no latency.
	p.sliceChanged(slice, time.Time{})
	p.received(state.KindEndpointSlice, nil)
}

// OnNodeUpdate records this node's Node, and whether it is eligible for
// load-balancer traffic (not being deleted, not being drained by the autoscaler).
func (p *Proxier) OnNodeUpdate(node *v1.Node) {
	err := p.tracker.UpdateNode(node)
	if p.cfg.Healthz != nil && node.Name == p.cfg.NodeName {
		p.cfg.Healthz.SetNodeEligible(nodeEligible(node))
	}
	p.received(state.KindNode, err)
}

// OnNodeDelete records that this node's Node is gone.
func (p *Proxier) OnNodeDelete(node *v1.Node) {
	p.tracker.DeleteNode(node)
	if p.cfg.Healthz != nil && node.Name == p.cfg.NodeName {
		p.cfg.Healthz.SetNodeEligible(false)
	}
	p.received(state.KindNode, nil)
}

// OnServiceCIDRUpdate records an added or updated ServiceCIDR (networking.k8s.io/v1),
// whose ranges, with the configured serviceCIDR, bound the allocated service IPs.
func (p *Proxier) OnServiceCIDRUpdate(c *networkingv1.ServiceCIDR) {
	err := p.tracker.UpdateServiceCIDR(c)
	p.received(state.KindServiceCIDR, err)
}

// OnServiceCIDRDelete records a deleted ServiceCIDR.
func (p *Proxier) OnServiceCIDRDelete(c *networkingv1.ServiceCIDR) {
	p.tracker.DeleteServiceCIDR(c)
	p.received(state.KindServiceCIDR, nil)
}

// received is the common tail of the event handlers: it logs an invalid object,
// records that a sync is queued, and asks for one.
func (p *Proxier) received(kind string, err error) {
	if err != nil {
		p.log.Warn("ignoring invalid object", "kind", kind, "err", err)
	}
	now := metrics.UnixSeconds(p.clock.Now())
	for _, fam := range p.families {
		p.metrics.LastQueuedTimestamp.WithLabelValues(metrics.Family(fam)).Set(now)
	}
	if p.cfg.Healthz != nil {
		p.cfg.Healthz.QueuedUpdate()
	}
	if p.cfg.OnChange != nil {
		p.cfg.OnChange()
	}
}

// serviceChanged counts a Service change, and the Service as pending.
func (p *Proxier) serviceChanged(svc *v1.Service) {
	p.metrics.ServiceChangesTotal.Inc()
	p.triggersMu.Lock()
	defer p.triggersMu.Unlock()
	p.pendingServices[state.ServiceName{Namespace: svc.Namespace, Name: svc.Name}] = true
	p.metrics.ServiceChangesPending.Set(float64(len(p.pendingServices)))
}

// sliceChanged counts an EndpointSlice change of an IP family (kube-proxy ignores
// FQDN slices), and records the trigger time at of its Service's change unless it
// is zero or older than the Proxier.
func (p *Proxier) sliceChanged(slice *discoveryv1.EndpointSlice, at time.Time) {
	var fam knftables.Family
	switch slice.AddressType {
	case discoveryv1.AddressTypeIPv4:
		fam = knftables.IPv4Family
	case discoveryv1.AddressTypeIPv6:
		fam = knftables.IPv6Family
	default:
		return
	}
	p.metrics.EndpointChangesTotal.Inc()
	p.triggersMu.Lock()
	defer p.triggersMu.Unlock()
	p.pendingSlices++
	p.metrics.EndpointChangesPending.Set(float64(p.pendingSlices))
	if at.IsZero() || at.Before(p.started) {
		return
	}
	if now := p.clock.Now(); at.After(now) {
		at = now // the API server's clock is ahead of ours
	}
	svc := sliceService(slice)
	p.triggers[svc] = append(p.triggers[svc], trigger{at: at, family: fam})
}

// sliceService returns the Service a slice belongs to, by its service-name label.
func sliceService(slice *discoveryv1.EndpointSlice) state.ServiceName {
	return state.ServiceName{Namespace: slice.Namespace, Name: slice.Labels[discoveryv1.LabelServiceName]}
}

// triggerTime returns the slice's last-change-trigger-time, or zero when it has
// none or it does not parse.
func triggerTime(slice *discoveryv1.EndpointSlice) time.Time {
	v, ok := slice.Annotations[LastChangeTriggerTimeAnnotation]
	if !ok {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}
	}
	return t
}

// nodeEligible reports whether node may receive load-balancer traffic.
func nodeEligible(node *v1.Node) bool {
	if node.DeletionTimestamp != nil {
		return false
	}
	for _, t := range node.Spec.Taints {
		if t.Key == TaintToBeDeleted {
			return false
		}
	}
	return true
}
