package sim

import (
	"fmt"
	"strings"
	"time"
)

// Taken is a batch of elements taken out of a set of a Runtime (TakeElements), to be
// put into a set of the same key type (PutElements), possibly after a Load that
// removed the set they came from.
type Taken struct {
	key  fieldTypes
	keys []string
}

// Len returns the number of elements taken.
func (t *Taken) Len() int { return len(t.keys) }

// TakeElements removes from set name of table tableID ("family name") the live
// elements added from the packet path whose key fields, as nft lists them
// ("10.1.0.5", "172.30.0.10", "tcp", "80"), match accepts, and returns them. A
// missing set has nothing to take. It is what a control plane does with "nft list
// set" and "nft delete element".
func (rt *Runtime) TakeElements(tableID, name string, match func(fields []string) bool) *Taken {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	s, err := rt.namedSet(tableID, name)
	if err != nil || s.isMap {
		return &Taken{}
	}
	t := &Taken{key: s.key}
	now := rt.env.now()
	for k, d := range rt.dyn[s] {
		if d.deleted || (!d.expires.IsZero() && !now.Before(d.expires)) {
			continue
		}
		if match(strings.Split(formatFields(s.key, []byte(k)), " . ")) {
			delete(rt.dyn[s], k)
			t.keys = append(t.keys, k)
		}
	}
	return t
}

// PutElements adds the taken elements to set name of table tableID, each with the
// given timeout (none when zero), as "nft add element … timeout" does. The set must
// have the key type of the set they were taken from.
func (rt *Runtime) PutElements(tableID, name string, t *Taken, timeout time.Duration) error {
	if t.Len() == 0 {
		return nil
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	s, err := rt.namedSet(tableID, name)
	if err != nil {
		return err
	}
	if s.isMap || !s.key.compatible(t.key) {
		return fmt.Errorf("put elements into %s: not a set of key type %s", name, t.key)
	}
	var expires time.Time
	if timeout > 0 {
		expires = rt.env.now().Add(timeout)
	}
	if rt.dyn[s] == nil {
		rt.dyn[s] = map[string]dynElem{}
	}
	for _, k := range t.keys {
		rt.dyn[s][k] = dynElem{expires: expires}
	}
	return nil
}

// namedSet returns set name of table tableID in the loaded program.
func (rt *Runtime) namedSet(tableID, name string) (*setDef, error) {
	for _, t := range rt.prog.tables {
		if s := t.sets[name]; s != nil && t.id() == tableID {
			return s, nil
		}
	}
	return nil, fmt.Errorf("no set %s in table %s", name, tableID)
}
