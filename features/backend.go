package features

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/packet"
	"github.com/nftproxy/nftproxy/proxier"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
	"github.com/nftproxy/nftproxy/proxier/syncer"
)

// ErrUnsupported is returned (wrapped, with the reason) by a backend that cannot
// reproduce a step, such as a protocol its kernel lacks; the step is skipped there.
var ErrUnsupported = errors.New("not supported by this backend")

// Backend runs scenarios somewhere: on the simulator, or on a real kernel. The
// proxier under test is always the production proxier.Proxier (see Run); a backend
// gives it the node's tables to write and makes what it wrote serve packets.
type Backend interface {
	// Name is "sim" or "kernel".
	Name() string
	// Start prepares the backend for a scenario and returns the node's tables.
	Start(sc *Scenario) (Tables, error)
	// Synced is told of every sync of the Proxier, once all families are synced:
	// the state st they now hold and, per family, what the sync did. The backend
	// makes the tables serve the packets that follow.
	Synced(st *state.ClusterState, syncs []FamilySync) error
	// Table reads back the family's table the Proxier writes.
	Table(family knftables.Family) (*TableView, error)
	// FreshTable writes want into a table of its own, by one full sync of a new
	// syncer through nft alone, and reads it back the way Table does.
	FreshTable(want *ruleset.Ruleset) (*TableView, error)
	// Send sends the packet from its origin and reports what happened to it.
	Send(p packet.Packet, from Origin, exp *Expect) (*Observation, error)
	// Advance lets time pass.
	Advance(d time.Duration) error
	// Close releases everything Start made.
	Close() error
}

// Tables is how the Proxier opens the tables of a backend's node and writes their
// elements over netlink (see proxier.Config).
type Tables struct {
	NewNFT  proxier.NewNFTFunc
	Netlink proxier.NetlinkFunc
}

// FamilySync is one family's successful sync (see proxier.Config.OnSynced).
type FamilySync struct {
	Family knftables.Family
	// Applied is the ruleset the family's table now holds.
	Applied *ruleset.Ruleset
	// Result is what the sync did.
	Result syncer.Result
}

// Observation is what a backend saw happen to a packet.
type Observation struct {
	// Verdict is "accept", "drop" or "reject".
	Verdict string
	// Local is true when the packet was delivered to the node itself.
	Local bool
	// DNAT is true when the destination was translated.
	DNAT bool
	// Endpoints are the destinations the packet was (or may be) DNATed to.
	Endpoints []netip.AddrPort
	// Chosen is the endpoint this packet's connection actually went to, when known
	// (the simulator commits one branch; the kernel reports who answered).
	Chosen netip.AddrPort
	// Masquerade is true when the source was masqueraded.
	Masquerade bool
	// Source is the source address the endpoint saw.
	Source netip.Addr
	// Trace is the backend's full account, printed when an expectation fails.
	Trace string
}

// String summarises the observation.
func (o *Observation) String() string {
	var b strings.Builder
	b.WriteString(o.Verdict)
	if o.Local {
		b.WriteString(", delivered to the node")
	}
	if o.DNAT {
		var eps []string
		for _, e := range o.Endpoints {
			eps = append(eps, e.String())
		}
		fmt.Fprintf(&b, ", endpoints %s", strings.Join(eps, ", "))
	} else {
		b.WriteString(", not DNATed")
	}
	if o.Masquerade {
		b.WriteString(", masqueraded")
	}
	if o.Source.IsValid() {
		fmt.Fprintf(&b, ", endpoint sees %s", o.Source)
	}
	return b.String()
}

// Check compares an observation with the expectation; sticky is the endpoint the
// previous packet from the same client went to (invalid when none).
func Check(exp *Expect, obs *Observation, sticky netip.AddrPort) error {
	var problems []string
	switch {
	case exp.Drop:
		if obs.Verdict != "drop" {
			problems = append(problems, "want DROP")
		}
	case exp.Reject:
		if obs.Verdict != "reject" {
			problems = append(problems, "want REJECT")
		}
	case exp.Local:
		if obs.Verdict != "accept" || !obs.Local || obs.DNAT {
			problems = append(problems, "want delivery to the node without DNAT")
		}
	case exp.Unhandled:
		if obs.Verdict != "accept" || obs.DNAT || obs.Masquerade {
			problems = append(problems, "want the packet to pass untouched")
		}
	default:
		if obs.Verdict != "accept" || !obs.DNAT {
			problems = append(problems, "want DNAT to an endpoint")
			break
		}
		want := sortedAddrPorts(exp.Endpoints)
		got := sortedAddrPorts(obs.Endpoints)
		if exp.Sticky {
			if len(got) != 1 || !slices.Contains(want, got[0]) {
				problems = append(problems, "want exactly one of the endpoints (affinity)")
			} else if sticky.IsValid() && got[0] != sticky {
				problems = append(problems, fmt.Sprintf("want the endpoint of the previous packet, %s", sticky))
			}
		} else if !slices.Equal(want, got) {
			problems = append(problems, "want exactly the endpoints listed")
		}
		if exp.Masquerade != nil && *exp.Masquerade != obs.Masquerade {
			problems = append(problems, fmt.Sprintf("want masquerade=%v", *exp.Masquerade))
		}
		if exp.Source != nil && *exp.Source != obs.Source {
			problems = append(problems, fmt.Sprintf("want the endpoint to see source %s", *exp.Source))
		}
	}
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("%s\n  expected: %s\n  observed: %s", strings.Join(problems, "; "), exp, obs)
}

func sortedAddrPorts(in []netip.AddrPort) []netip.AddrPort {
	out := slices.Clone(in)
	slices.SortFunc(out, func(a, b netip.AddrPort) int { return a.Compare(b) })
	return slices.Compact(out)
}
