package sim

import (
	"fmt"
	"strconv"
	"strings"
)

// jsonStmtMore renders the statements of nft's JSON that jsonStmt leaves to it:
// tproxy, synproxy, dup, fwd and meter. ok is false for any other.
func jsonStmtMore(k string, arg map[string]any) (s string, ok bool, err error) {
	switch k {
	case "tproxy":
		s = "tproxy"
		if f := str(arg["family"]); f != "" {
			s += " " + f
		}
		to := str(arg["addr"])
		if strings.Contains(to, ":") && str(arg["port"]) != "" {
			to = "[" + to + "]"
		}
		if p := str(arg["port"]); p != "" {
			to += ":" + p
		}
		return s + " to " + to, true, nil
	case "synproxy":
		s = "synproxy"
		if m := str(arg["mss"]); m != "" {
			s += " mss " + m
		}
		if w := str(arg["wscale"]); w != "" {
			s += " wscale " + w
		}
		flags, _ := arg["flags"].([]any)
		for _, f := range flags {
			s += " " + str(f)
		}
		return s, true, nil
	case "dup", "fwd":
		s = k + " to " + str(arg["addr"])
		if d := str(arg["dev"]); d != "" {
			if s == k+" to " {
				return k + " to " + strconv.Quote(d), true, nil
			}
			s += " device " + strconv.Quote(d)
		}
		return s, true, nil
	case "meter":
		key, err := jsonValue(arg["key"])
		if err != nil {
			return "", true, fmt.Errorf("meter %s: %w", str(arg["name"]), err)
		}
		st, err := jsonStmt(arg["stmt"])
		if err != nil {
			return "", true, fmt.Errorf("meter %s: %w", str(arg["name"]), err)
		}
		s = "meter " + quoteName(str(arg["name"]))
		if n := str(arg["size"]); n != "" {
			s += " size " + n
		}
		return s + " { " + key + " " + st + " }", true, nil
	}
	return "", false, nil
}

// jsonElemStmts renders the statements of a set element added from the packet
// path ("add @s { ip saddr limit rate 10/second }"), each after a space.
func jsonElemStmts(v any) (string, error) {
	list, _ := v.([]any)
	s := ""
	for _, e := range list {
		st, err := jsonStmt(e)
		if err != nil {
			return "", err
		}
		s += " " + st
	}
	return s, nil
}

// jsonDevices renders a chain's "dev": " device NAME", " devices = { A, B }", or
// nothing.
func jsonDevices(dev any) string {
	switch d := dev.(type) {
	case string:
		return " device " + strconv.Quote(d)
	case []any:
		var names []string
		for _, n := range d {
			names = append(names, strconv.Quote(str(n)))
		}
		return " devices = { " + strings.Join(names, ", ") + " }"
	}
	return ""
}

// jsonHash renders "jhash EXPR mod N [seed S] [offset K]" and "symhash mod N [offset K]".
func jsonHash(k string, arg map[string]any) (string, error) {
	s := k
	if k == "jhash" {
		key, err := jsonExpr(arg["expr"])
		if err != nil {
			return "", fmt.Errorf("jhash: %w", err)
		}
		s += " " + key
	}
	s += " mod " + str(arg["mod"])
	if seed := str(arg["seed"]); seed != "" {
		n, err := strconv.ParseUint(seed, 10, 32)
		if err != nil {
			return "", fmt.Errorf("jhash: bad seed %q", seed)
		}
		s += fmt.Sprintf(" seed 0x%x", n)
	}
	if o := str(arg["offset"]); o != "" && o != "0" {
		s += " offset " + o
	}
	return s, nil
}
