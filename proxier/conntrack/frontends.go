package conntrack

import (
	"net/netip"
	"slices"

	"github.com/nftproxy/nftproxy/proxier/state"
)

// Frontends finds the conntrack entries a sync makes stale from the Services the
// sync changed, so that cleanup costs what changed rather than a walk of every
// Service. Services may share a UDP frontend (an external or load-balancer IP, a
// ClusterIP two Services claim), and a frontend's flows to an endpoint stay while
// any of its Services may use the endpoint: Frontends remembers which Services
// had each UDP frontend in the last state it saw, to read those that share a
// frontend with a changed one.
type Frontends struct {
	owners map[frontend][]state.ServiceName
}

// NewFrontends returns a Frontends that has seen no state.
func NewFrontends() *Frontends {
	return &Frontends{owners: map[frontend][]state.ServiceName{}}
}

// Stale returns what the package's Stale returns for going from old to new, and
// records new as the last state seen. old is nil before the first sync: Stale
// then reads every Service of new. Otherwise only the Services in changed may
// differ between new and the state of the previous call, and old need hold only
// those, as that state had them (and its Node); other Services are read from new,
// and only where they share a frontend with a changed one.
func (f *Frontends) Stale(old, new *state.ClusterState, changed map[state.ServiceName]bool) []Filter {
	if old == nil {
		clear(f.owners)
		cur := frontends{}
		for name, svc := range new.Services {
			is := serviceFrontends(new, svc)
			for fe := range is {
				f.own(fe, name)
			}
			cur.merge(is)
		}
		return diff(nil, cur)
	}
	prev, cur := frontends{}, frontends{}
	touched := map[frontend]bool{}
	for name := range changed {
		was := serviceFrontends(old, old.Services[name])
		is := serviceFrontends(new, new.Services[name])
		for fe := range was {
			touched[fe] = true
			f.disown(fe, name)
		}
		for fe := range is {
			touched[fe] = true
			f.own(fe, name)
		}
		prev.merge(was)
		cur.merge(is)
	}
	// The unchanged Services that share a touched frontend are the same in both
	// states: what they use of it is in prev and cur alike.
	others := map[state.ServiceName]frontends{}
	for fe := range touched {
		for _, name := range f.owners[fe] {
			if changed[name] {
				continue
			}
			fs, ok := others[name]
			if !ok {
				fs = serviceFrontends(new, new.Services[name])
				others[name] = fs
			}
			prev.addSet(fe, fs[fe])
			cur.addSet(fe, fs[fe])
		}
	}
	return diff(prev, cur)
}

// serviceFrontends returns the UDP frontends of svc in st (none for a nil svc).
func serviceFrontends(st *state.ClusterState, svc *state.Service) frontends {
	if svc == nil {
		return nil
	}
	fs := frontends{}
	fs.addService(st, svc)
	return fs
}

// own records that Service name has frontend fe.
func (f *Frontends) own(fe frontend, name state.ServiceName) {
	if !slices.Contains(f.owners[fe], name) {
		f.owners[fe] = append(f.owners[fe], name)
	}
}

// disown records that Service name no longer has frontend fe.
func (f *Frontends) disown(fe frontend, name state.ServiceName) {
	names := slices.DeleteFunc(f.owners[fe], func(n state.ServiceName) bool { return n == name })
	if len(names) == 0 {
		delete(f.owners, fe)
	} else {
		f.owners[fe] = names
	}
}

// merge adds every frontend of other, with its endpoints, to f.
func (f frontends) merge(other frontends) {
	for fe, eps := range other {
		f.addSet(fe, eps)
	}
}

// addSet records fe with the endpoints of eps.
func (f frontends) addSet(fe frontend, eps map[netip.AddrPort]bool) {
	set := f[fe]
	if set == nil {
		set = make(map[netip.AddrPort]bool, len(eps))
		f[fe] = set
	}
	for ep := range eps {
		set[ep] = true
	}
}
