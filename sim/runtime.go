package sim

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/nftproxy/nftproxy/packet"
)

// maxBranches bounds how many numgen paths one trace explores.
const maxBranches = 4096

// Runtime is a Program running on a node: it keeps the state packets leave behind —
// conntrack entries, elements added to sets and maps from the packet path (update
// @set, update @map { key : data }) with their data and timeouts, numgen inc counters
// — so that later packets see it. Each Trace explores every numgen branch, then
// commits one branch (chosen by Env.Select, or at random by probability with a
// generator seeded from Env.Seed). It is safe for concurrent use; traces are
// serialized.
type Runtime struct {
	prog  *Program
	env   Env
	local localSet
	start time.Time

	mu     sync.Mutex
	ct     *conntrack
	dyn    map[*setDef]map[string]dynElem
	numgen map[string]uint32
	rng    *rand.Rand
}

// dynElem is a set or map element added or deleted from the packet path.
type dynElem struct {
	expires time.Time // zero: never
	data    string    // map data
	deleted bool
}

// NewRuntime returns a Runtime for prog on the node env describes.
func NewRuntime(prog *Program, env Env) *Runtime {
	return &Runtime{
		prog:   prog,
		env:    env,
		local:  newLocalSet(env.LocalAddrs),
		start:  env.now(),
		ct:     newConntrack(),
		dyn:    map[*setDef]map[string]dynElem{},
		numgen: map[string]uint32{},
		rng:    rand.New(rand.NewPCG(env.Seed, 0x6e667470726f7879)),
	}
}

// Trace follows a packet through prog on the node env describes, from a fresh state
// (no conntrack entries, no dynamic set elements). Nothing is committed.
func (prog *Program) Trace(p packet.Packet, env Env) (*Trace, error) {
	return NewRuntime(prog, env).trace(p)
}

// Trace follows a packet through the program with the runtime's current state, then
// commits one branch: its conntrack entry (if the packet was accepted and is the first
// of a connection), its set updates and numgen counters.
func (rt *Runtime) Trace(p packet.Packet) (*Trace, error) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	t, err := rt.trace(p)
	if err != nil {
		return nil, err
	}
	i := rt.pick(t)
	if i < 0 || i >= len(t.Branches) {
		return nil, &TraceError{Packet: p.String(), Msg: fmt.Sprintf("Env.Select returned branch %d of %d", i, len(t.Branches))}
	}
	rt.commit(t.Branches[i].run)
	t.Committed = i
	return t, nil
}

// Load replaces the runtime's program with prog, as applying a new version of the
// ruleset to the kernel would, and keeps what the kernel keeps across such a
// transaction: conntrack entries, the elements packets added to sets and maps that
// still exist (same table, name, key and data type), and numgen inc counters of
// unchanged rules. A set deleted and re-created under the same name cannot be told
// apart from one that was kept, and keeps its elements.
func (rt *Runtime) Load(prog *Program) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	newSets := map[string]*setDef{}
	for _, t := range prog.tables {
		for _, s := range t.setL {
			newSets[t.id()+"\x00"+s.name] = s
		}
	}
	dyn := map[*setDef]map[string]dynElem{}
	for old, m := range rt.dyn {
		s, ok := newSets[old.table.id()+"\x00"+old.name]
		if ok && s.isMap == old.isMap && s.key.compatible(old.key) && s.data.compatible(old.data) {
			dyn[s] = m
		}
	}
	rt.prog = prog
	rt.dyn = dyn
}

// Conns returns the runtime's conntrack entries, sorted by original tuple.
func (rt *Runtime) Conns() []Conn {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.ct.list()
}

// FlushConntrack removes all conntrack entries, as `conntrack -F` does.
func (rt *Runtime) FlushConntrack() {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.ct = newConntrack()
}

// SetElements returns the elements added to set or map name of table ("family name")
// from the packet path that are live at the clock's current time, sorted, as nft
// prints them: "KEY" for a set, "KEY : DATA" for a map.
func (rt *Runtime) SetElements(tableID, name string) []string {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	now := rt.env.now()
	var out []string
	for s, m := range rt.dyn {
		if s.name != name || s.table.id() != tableID {
			continue
		}
		for k, d := range m {
			if d.deleted || (!d.expires.IsZero() && !now.Before(d.expires)) {
				continue
			}
			e := formatFields(s.key, []byte(k))
			if s.isMap {
				e += " : " + formatFields(s.data, []byte(d.data))
			}
			out = append(out, e)
		}
	}
	sort.Strings(out)
	return out
}

func (rt *Runtime) pick(t *Trace) int {
	if rt.env.Select != nil {
		return rt.env.Select(t)
	}
	if len(t.Branches) == 1 {
		return 0
	}
	// Branches of different assumptions each sum to 1; pick among all in proportion.
	total := 0.0
	for _, b := range t.Branches {
		total += b.Probability
	}
	x := rt.rng.Float64() * total
	acc := 0.0
	for i, b := range t.Branches {
		acc += b.Probability
		if x < acc {
			return i
		}
	}
	return len(t.Branches) - 1
}

func (rt *Runtime) commit(r *run) {
	for _, fx := range r.setFx {
		m := rt.dyn[fx.set]
		if m == nil {
			m = map[string]dynElem{}
			rt.dyn[fx.set] = m
		}
		m[fx.key] = dynElem{expires: fx.expires, data: fx.data, deleted: fx.op == "delete"}
	}
	for site, n := range r.incs {
		rt.numgen[site] += n
	}
	if r.conn != nil {
		rt.ct.add(r.conn)
	}
}

// trace explores all branches of p.
func (rt *Runtime) trace(p packet.Packet) (*Trace, error) {
	if err := p.Validate(); err != nil {
		return nil, &TraceError{Packet: p.String(), Msg: "invalid packet", Err: err}
	}
	t := &Trace{Packet: p, Committed: -1}
	queue := [][]int{nil}
	for len(queue) > 0 {
		script := queue[0]
		queue = queue[1:]
		b, err := rt.runOnce(p, script)
		if err != nil {
			return nil, &TraceError{Packet: p.String(), Err: err}
		}
		t.Branches = append(t.Branches, b)
		if len(t.Branches)+len(queue) > maxBranches {
			return nil, &TraceError{Packet: p.String(), Msg: fmt.Sprintf("more than %d branches", maxBranches)}
		}
		for i := len(script); i < len(b.Choices); i++ {
			for v := 1; v < b.Choices[i].Mod; v++ {
				next := make([]int, i+1)
				for j := 0; j < i; j++ {
					next[j] = b.Choices[j].Value
				}
				next[i] = v
				queue = append(queue, next)
				if len(t.Branches)+len(queue) > maxBranches {
					return nil, &TraceError{Packet: p.String(), Msg: fmt.Sprintf("more than %d branches", maxBranches)}
				}
			}
		}
	}
	sort.SliceStable(t.Branches, func(i, j int) bool { return t.Branches[i].Probability > t.Branches[j].Probability })
	return t, nil
}
