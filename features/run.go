package features

import (
	"context"
	"errors"
	"fmt"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/packet"
	"github.com/nftproxy/nftproxy/proxier"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/syncer"
)

// families are the families every scenario programs, as the daemon does.
var families = []knftables.Family{knftables.IPv4Family, knftables.IPv6Family}

// syncTimeout bounds one sync of a scenario step.
const syncTimeout = 30 * time.Second

// Run is a scenario running on a backend. The production proxier.Proxier writes
// the backend's tables, on the daemon's path: the scenario's cluster is its first
// (full) sync, each update and delete step an incremental sync of what changed
// (changeset.Builder, syncer.Syncer.Apply, kept objects, netlink batches), and a
// resync step the periodic full sync. After every sync the tables are compared
// with a fresh full build of the same state (see CompareFresh).
type Run struct {
	sc    *Scenario
	b     Backend
	p     *proxier.Proxier
	syncs []FamilySync
}

// Start starts sc on b and makes the first sync. On failure b is closed.
func Start(sc *Scenario, b Backend) (_ *Run, err error) {
	tables, err := b.Start(sc)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, b.Close())
		}
	}()
	r := &Run{sc: sc, b: b}
	r.p, err = proxier.New(proxier.Config{
		NodeName: sc.Node.Name,
		Ruleset:  sc.Config,
		Families: families,
		NewNFT:   tables.NewNFT,
		Netlink:  tables.Netlink,
		OnSynced: r.synced,
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", sc.File, err)
	}
	if err := sc.Load(r.p.Tracker()); err != nil {
		return nil, err
	}
	if err := r.sync(false); err != nil {
		return nil, err
	}
	return r, nil
}

// Syncs returns what the last sync did, per family.
func (r *Run) Syncs() []FamilySync { return r.syncs }

// Update applies the objects of d and syncs incrementally.
func (r *Run) Update(d Docs) error {
	if err := r.sc.Apply(r.p.Tracker(), d); err != nil {
		return err
	}
	return r.sync(false)
}

// Delete removes the referenced objects and syncs incrementally.
func (r *Run) Delete(refs []ObjectRef) error {
	Delete(r.p.Tracker(), refs)
	return r.sync(false)
}

// Resync runs the periodic full sync, which rewrites every table.
func (r *Run) Resync() error { return r.sync(true) }

// Send sends a packet through the backend.
func (r *Run) Send(p packet.Packet, from Origin, exp *Expect) (*Observation, error) {
	return r.b.Send(p, from, exp)
}

// Advance lets time pass on the backend.
func (r *Run) Advance(d time.Duration) error { return r.b.Advance(d) }

// sync makes the Proxier sync, tells the backend, and compares every table with a
// fresh full build of the same state.
func (r *Run) sync(full bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), syncTimeout)
	defer cancel()
	r.syncs = nil
	if err := r.p.SyncMode(ctx, full); err != nil {
		return fmt.Errorf("%s [%s]: %w", r.sc.File, r.b.Name(), err)
	}
	st := r.p.Tracker().State()
	if err := r.b.Synced(st, r.syncs); err != nil {
		return fmt.Errorf("%s [%s]: %w", r.sc.File, r.b.Name(), err)
	}
	var errs []error
	for _, fam := range families {
		want := ruleset.Build(st, r.sc.Config, fam)
		fresh, err := r.b.FreshTable(want)
		if err != nil {
			return fmt.Errorf("%s [%s]: fresh %s table: %w", r.sc.File, r.b.Name(), fam, err)
		}
		live, err := r.b.Table(fam)
		if err != nil {
			return fmt.Errorf("%s [%s]: reading the %s table: %w", r.sc.File, r.b.Name(), fam, err)
		}
		errs = append(errs, CompareFresh(live, fresh, want))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%s [%s]: %w", r.sc.File, r.b.Name(), err)
	}
	return nil
}

// synced is the Proxier's OnSynced.
func (r *Run) synced(fam knftables.Family, applied *ruleset.Ruleset, res syncer.Result) {
	r.syncs = append(r.syncs, FamilySync{Family: fam, Applied: applied, Result: res})
}

// Close closes the backend.
func (r *Run) Close() error { return r.b.Close() }
