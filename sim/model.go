package sim

import (
	"strconv"
	"strings"
	"time"
)

// table is a compiled nftables table.
type table struct {
	family  string // ip, ip6, inet
	name    string
	chains  map[string]*chain
	chainL  []*chain // creation order
	sets    map[string]*setDef
	setL    []*setDef
	comment string
	dormant bool // a dormant table's base chains see no packets
}

func (t *table) id() string { return t.family + " " + t.name }

// chain is a compiled chain: a base chain has hook information.
type chain struct {
	name    string
	table   *table
	base    *baseChain
	rules   []*rule
	comment string
}

// baseChain is the hook attachment of a base chain.
type baseChain struct {
	typ      string // filter, nat, route
	hook     string // prerouting, input, forward, output, postrouting
	prio     int
	prioText string
	policy   verdictKind // vAccept or vDrop
	// devices are the interfaces an ingress or egress chain hooks.
	devices []string
}

// rule is a compiled rule: its statements, in order.
type rule struct {
	text  string
	stmts []stmt
	line  int
}

// parseDuration reads an nft time value: "10800s", "3h", "1d2h3m4s", "500ms".
func parseDuration(s string) (time.Duration, bool) {
	if s == "" {
		return 0, false
	}
	var total time.Duration
	i := 0
	for i < len(s) {
		j := i
		for j < len(s) && s[j] >= '0' && s[j] <= '9' {
			j++
		}
		if j == i {
			return 0, false
		}
		var n int64
		for _, c := range s[i:j] {
			n = n*10 + int64(c-'0')
			if n > 1<<40 {
				return 0, false
			}
		}
		k := j
		for k < len(s) && (s[k] < '0' || s[k] > '9') {
			k++
		}
		var unit time.Duration
		switch s[j:k] {
		case "d":
			unit = 24 * time.Hour
		case "h":
			unit = time.Hour
		case "m":
			unit = time.Minute
		case "s", "":
			unit = time.Second
		case "ms":
			unit = time.Millisecond
		default:
			return 0, false
		}
		total += time.Duration(n) * unit
		i = k
	}
	return total, true
}

// durationUnits are the units nft prints time values in, largest first.
var durationUnits = []struct {
	d    time.Duration
	name string
}{{24 * time.Hour, "d"}, {time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}, {time.Millisecond, "ms"}}

// formatDuration renders d as nft prints a time value, to the millisecond: "3h",
// "1d2h", "59s992ms".
func formatDuration(d time.Duration) string {
	if d < time.Millisecond {
		return "0s"
	}
	var b strings.Builder
	for _, u := range durationUnits {
		if n := d / u.d; n > 0 {
			b.WriteString(strconv.FormatInt(int64(n), 10))
			b.WriteString(u.name)
			d -= n * u.d
		}
	}
	return b.String()
}
