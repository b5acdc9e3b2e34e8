package changeset

import (
	"slices"
	"strconv"
	"strings"

	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// AffinityMove says what becomes of the session-affinity records of one frontend
// whose endpoint at one index changed: the records of Frontend in set From (a
// client . frontend each) move to set To, the affinity set of the index where their
// endpoint is now, or are deleted when To is empty (the endpoint is gone).
type AffinityMove struct {
	// Frontend is the frontend key: address . protocol . port, or protocol . port
	// for a node port, whose records (client . address . protocol . port) may have
	// any of the node's addresses.
	Frontend []string
	NodePort bool
	From, To string
	// Timeout is the Service's affinity timeout in seconds ("10800"), which a moved
	// record is given anew.
	Timeout string
}

// Matches reports whether record (client . address . protocol . port, as listed
// from an affinity set) belongs to m's frontend; nodeIPs are the addresses node
// ports are served on.
func (m *AffinityMove) Matches(record []string, nodeIPs map[string]bool) bool {
	if len(record) != 4 {
		return false
	}
	if m.NodePort {
		return nodeIPs[record[1]] && slices.Equal(record[2:], m.Frontend)
	}
	return slices.Equal(record[1:], m.Frontend)
}

// AffinityMoves returns the moves that keep session-affinity records pointing at
// the endpoint their client was sent to once delta is applied to the table of
// desired: the records name an endpoint by its index in the frontend's affinity
// backends maps, and delta may have moved or removed endpoints. It looks only at
// the affinity backends maps of delta, so a sync without affinity changes costs
// nothing here.
func AffinityMoves(desired *ruleset.Ruleset, delta *Delta) []AffinityMove {
	type group struct {
		prefix   string // the map name without its index
		frontend string
	}
	type slot struct{ old, new string }
	groups := map[group]map[int]slot{}
	keys := map[group][]string{}
	for m, es := range delta.Elements {
		prefix, idx, ok := affinityMapIndex(m)
		if !ok {
			continue
		}
		for k, ch := range es {
			g := group{prefix, k}
			if groups[g] == nil {
				groups[g] = map[int]slot{}
			}
			var s slot
			if ch.Old != nil {
				s.old = ch.Old.Data
			}
			if ch.New != nil {
				s.new = ch.New.Data
			}
			keys[g] = ruleset.SplitFields(nil, k)
			groups[g][idx] = s
		}
	}
	var moves []AffinityMove
	for g, slots := range groups {
		local := strings.Contains(g.prefix, "local-")
		nodePort := strings.Contains(g.prefix, "nodeport-")
		timeout := desired.AffinitySeconds(g.frontend, nodePort)
		for i, s := range slots {
			if s.old == "" || s.old == s.new {
				continue
			}
			mv := AffinityMove{Frontend: keys[g], NodePort: nodePort, From: ruleset.ClientsSet(i, local), Timeout: timeout}
			for j, t := range slots {
				if t.new == s.old && timeout != "" {
					mv.To = ruleset.ClientsSet(j, local)
				}
			}
			moves = append(moves, mv)
		}
	}
	slices.SortFunc(moves, func(a, b AffinityMove) int {
		return strings.Compare(strings.Join(a.Frontend, " ")+" "+a.From, strings.Join(b.Frontend, " ")+" "+b.From)
	})
	return moves
}

// affinityMapIndex splits the name of an affinity backends map
// ("affinity-nodeport-local-backends-2") into its prefix and index.
func affinityMapIndex(name string) (string, int, bool) {
	if !strings.HasPrefix(name, ruleset.AffinityMapPrefix) {
		return "", 0, false
	}
	i := strings.LastIndexByte(name, '-')
	if i < 0 || !strings.HasSuffix(name[:i+1], "backends-") {
		return "", 0, false
	}
	n, err := strconv.Atoi(name[i+1:])
	if err != nil {
		return "", 0, false
	}
	return name[:i+1], n, true
}
