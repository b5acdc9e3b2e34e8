package main

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"

	"github.com/nftproxy/nftproxy/sim"
)

// An assumption key names a kind of fork the simulator makes on what a packet cannot
// decide (sim.CompileOptions.Forks), and the words that name its two outcomes, taken
// from the labels sim gives them ("under limit rate 10/second", `xt match "physdev"
// does not match`, "at most 10 connections counted").
type assumeKey struct {
	name string
	// values are the outcome words the key accepts, in pairs: the two outcomes of
	// one form of the construct.
	values [][2]string
	// qualified says KEY:NAME narrows the key to one extension or field (xt:physdev,
	// meta:time, socket:transparent).
	qualified bool
	doc       string
}

// assumeKeys are the keys --assume accepts.
var assumeKeys = []assumeKey{
	{"limit", [][2]string{{"under", "over"}, {"match", "no-match"}}, false, "limit rate (under or over the rate); named limit objects (match or no-match)"},
	{"quota", [][2]string{{"within", "over"}, {"match", "no-match"}}, false, "quota (within it or over it); named quota objects (match or no-match)"},
	{"ct-count", [][2]string{{"at-most", "more"}}, false, "ct count (at most the count, or more)"},
	{"xt", [][2]string{{"match", "no-match"}, {"continue", "drop"}}, true, "xt match (match or no-match) and xt target (continue or drop); xt:NAME for one extension"},
	{"queue", [][2]string{{"accept", "drop"}}, false, "queue (the program reading it accepts or drops)"},
	{"socket", [][2]string{{"match", "no-match"}}, true, "socket matches; socket:KEY for one key"},
	{"meta", [][2]string{{"match", "no-match"}}, true, "meta time, day, hour, cpu, skuid, skgid, ... matches; meta:KEY for one key"},
	{"ether", [][2]string{{"match", "no-match"}}, true, "ether header matches; ether:FIELD for one field"},
	{"vlan", [][2]string{{"match", "no-match"}}, true, "vlan header matches"},
	{"arp", [][2]string{{"match", "no-match"}}, true, "arp header matches"},
	{"tproxy", [][2]string{{"socket", "no-socket"}}, false, "tproxy (a transparent socket listens where it points, or none)"},
	{"osf", [][2]string{{"match", "no-match"}}, false, "osf (the SYN comes from the operating system named, or not)"},
	{"tcp-option", [][2]string{{"match", "no-match"}}, true, "matches on TCP option values a packet does not show (timestamp tsval, sack left); tcp-option:NAME for one option"},
}

func findKey(name string) *assumeKey {
	for i := range assumeKeys {
		if assumeKeys[i].name == name {
			return &assumeKeys[i]
		}
	}
	return nil
}

func keyNames() string {
	var out []string
	for _, k := range assumeKeys {
		out = append(out, k.name)
	}
	return strings.Join(out, ", ")
}

// pin is one --assume KEY[:NAME]=VALUE.
type pin struct {
	text  string
	key   string
	qual  string
	value string
	// used says some traced branch had a choice the pin decides.
	used bool
}

// pins are the --assume flags: the outcomes of forks a trace keeps. A branch that
// assumes the other outcome of a pinned fork is dropped.
type pins []*pin

// String and Set make pins a flag.Value; --assume may be repeated, and one may hold
// several pins separated by commas.
func (p *pins) String() string {
	var out []string
	for _, x := range *p {
		out = append(out, x.text)
	}
	return strings.Join(out, ",")
}

func (p *pins) Set(s string) error {
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		x, err := parsePin(f)
		if err != nil {
			return err
		}
		for _, y := range *p {
			if y.key == x.key && y.qual == x.qual && y.value != x.value && samePair(x.key, x.value, y.value) {
				return fmt.Errorf("%s and %s contradict each other", y.text, x.text)
			}
		}
		*p = append(*p, x)
	}
	return nil
}

// samePair says v and w are the two outcomes of one form of key's construct.
func samePair(key, v, w string) bool {
	k := findKey(key)
	for _, pair := range k.values {
		if slices.Contains(pair[:], v) && slices.Contains(pair[:], w) {
			return true
		}
	}
	return false
}

func parsePin(s string) (*pin, error) {
	kq, value, ok := strings.Cut(s, "=")
	if !ok {
		return nil, fmt.Errorf("%q: want KEY=VALUE (KEY one of %s)", s, keyNames())
	}
	key, qual, _ := strings.Cut(kq, ":")
	k := findKey(key)
	if k == nil {
		return nil, fmt.Errorf("%q: unknown key %q; the keys are %s", s, key, keyNames())
	}
	if qual != "" && !k.qualified {
		return nil, fmt.Errorf("%q: %s takes no :NAME", s, key)
	}
	if strings.Contains(kq, ":") && qual == "" {
		return nil, fmt.Errorf("%q: empty NAME after %s:", s, key)
	}
	var accepted []string
	for _, pair := range k.values {
		accepted = append(accepted, pair[:]...)
	}
	if !slices.Contains(accepted, value) {
		return nil, fmt.Errorf("%q: %s takes %s (%s)", s, key, strings.Join(accepted, ", "), k.doc)
	}
	return &pin{text: s, key: key, qual: qual, value: value}, nil
}

// forkOf is what a pin needs to know of an assumed choice: its key, the extension or
// field it is about, the two words of its outcomes and the one the branch took. ok is
// false for a choice no pin decides (a single stated assumption, an unknown form).
func forkOf(ch sim.Choice) (key, qual string, pair [2]string, taken string, ok bool) {
	if !ch.Assumed || ch.Mod != 2 {
		return "", "", pair, "", false
	}
	f := strings.Fields(ch.Expr)
	if len(f) == 0 {
		return "", "", pair, "", false
	}
	out := ch.Outcome
	pick := func(p [2]string, isSecond bool) [2]string {
		taken = p[0]
		if isSecond {
			taken = p[1]
		}
		return p
	}
	named := len(f) > 1 && f[1] == "name"
	switch {
	case f[0] == "limit" && named, f[0] == "quota" && named:
		key, pair = f[0], pick([2]string{"match", "no-match"}, strings.HasSuffix(out, " does not match"))
	case f[0] == "limit":
		key, pair = "limit", pick([2]string{"under", "over"}, strings.HasPrefix(out, "over "))
	case f[0] == "quota":
		within := strings.HasPrefix(out, "within ") || strings.HasPrefix(out, "not yet ")
		key, pair = "quota", pick([2]string{"within", "over"}, !within)
	case f[0] == "ct" && len(f) > 1 && f[1] == "count":
		key, pair = "ct-count", pick([2]string{"at-most", "more"}, strings.HasPrefix(out, "more than "))
	case f[0] == "xt" && len(f) > 2:
		key, qual = "xt", f[2]
		if u, err := strconv.Unquote(qual); err == nil {
			qual = u
		}
		if f[1] == "match" {
			pair = pick([2]string{"match", "no-match"}, strings.HasSuffix(out, " does not match"))
		} else {
			pair = pick([2]string{"continue", "drop"}, strings.HasSuffix(out, " drops the packet"))
		}
	case f[0] == "queue":
		key, pair = "queue", pick([2]string{"accept", "drop"}, strings.Contains(out, " drops the packet"))
	case f[0] == "tproxy":
		key, pair = "tproxy", pick([2]string{"socket", "no-socket"}, strings.HasPrefix(out, "no socket "))
	case f[0] == "tcp" && len(f) > 2 && f[1] == "option":
		key, qual = "tcp-option", f[2]
		pair = pick([2]string{"match", "no-match"}, strings.Contains(out, " does not hold"))
	default:
		key = f[0]
		if key == "skuid" || key == "skgid" {
			key, qual = "meta", f[0]
		} else if len(f) > 1 {
			qual = f[1]
		}
		if findKey(key) == nil {
			return "", "", pair, "", false
		}
		pair = pick([2]string{"match", "no-match"}, strings.Contains(out, " does not hold"))
	}
	return key, qual, pair, taken, true
}

// decide returns the pin that decides ch, the most specific first (xt:physdev before
// xt), or nil.
func (p pins) decide(ch sim.Choice) (x *pin, taken string) {
	key, qual, pair, taken, ok := forkOf(ch)
	if !ok {
		return nil, ""
	}
	for _, specific := range []bool{true, false} {
		for _, x := range p {
			if x.key != key || (x.qual != "") != specific || (specific && x.qual != qual) {
				continue
			}
			if slices.Contains(pair[:], x.value) {
				return x, taken
			}
		}
	}
	return nil, ""
}

// keeps says no choice of br contradicts a pin.
func (p pins) keeps(br *sim.Branch) bool {
	for _, ch := range br.Choices {
		if x, taken := p.decide(ch); x != nil && taken != x.value {
			return false
		}
	}
	return true
}

// filter drops the branches of tr that contradict a pin, and marks the pins that
// decided some choice as used. Each remaining branch's probability is conditional
// on its assumptions, so those consistent with any one way the forks go still sum
// to 1.
func (p pins) filter(tr *sim.Trace) {
	if len(p) == 0 {
		return
	}
	var kept []*sim.Branch
	committed := -1
	for i, br := range tr.Branches {
		for _, ch := range br.Choices {
			if x, _ := p.decide(ch); x != nil {
				x.used = true
			}
		}
		if !p.keeps(br) {
			continue
		}
		if i == tr.Committed {
			committed = len(kept)
		}
		kept = append(kept, br)
	}
	tr.Branches, tr.Committed = kept, committed
}

// selector returns the sim.Env.Select of a sequence under pins: a branch that keeps
// to them, drawn by probability from a generator seeded with seed.
func (p pins) selector(seed uint64) func(*sim.Trace) int {
	rng := rand.New(rand.NewPCG(seed, 0x6e667470726f7879))
	return func(t *sim.Trace) int {
		total := 0.0
		var ok []int
		for i, br := range t.Branches {
			if p.keeps(br) {
				ok = append(ok, i)
				total += br.Probability
			}
		}
		if len(ok) == 0 {
			return 0
		}
		x := rng.Float64() * total
		for _, i := range ok {
			x -= t.Branches[i].Probability
			if x < 0 {
				return i
			}
		}
		return ok[len(ok)-1]
	}
}

// unused names the pins that decided nothing in any trace.
func (p pins) unused() []string {
	var out []string
	for _, x := range p {
		if !x.used {
			out = append(out, x.text)
		}
	}
	return out
}
