package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// CompileJSON compiles the JSON form of a ruleset (`nft -j list ruleset`,
// libnftables' JSON schema). It rewrites the JSON as nft commands and compiles
// those, so a *CompileError names the table, chain and rule, and quotes the rule as
// rewritten. Statements nft has no JSON form for (map updates) arrive as their text
// and are read as such. nft prints iptables-nft's matches and targets as bare xt
// expressions, without the translation its text listing carries (xt match
// "comment", xt match "statistic"), so the text listing is the better input for
// such rulesets.
func CompileJSON(src []byte, o CompileOptions) (*Program, error) {
	text, err := jsonToText(src)
	if err != nil {
		return nil, err
	}
	return CompileTextOptions(text, o)
}

// isJSON reports whether src looks like `nft -j` output rather than nft text.
func isJSON(src string) bool {
	return strings.HasPrefix(strings.TrimSpace(src), "{")
}

type jsonRuleset struct {
	Nftables []map[string]json.RawMessage `json:"nftables"`
}

type jsonTable struct {
	Family string   `json:"family"`
	Name   string   `json:"name"`
	Flags  []string `json:"flags"`
}

type jsonChain struct {
	Family string `json:"family"`
	Table  string `json:"table"`
	Name   string `json:"name"`
	Type   string `json:"type"`
	Hook   string `json:"hook"`
	Prio   *int   `json:"prio"`
	Policy string `json:"policy"`
	// Dev is an ingress or egress chain's device, or a list of them (nft 1.0.6
	// leaves it out).
	Dev any `json:"dev"`
}

type jsonSet struct {
	Family  string          `json:"family"`
	Table   string          `json:"table"`
	Name    string          `json:"name"`
	Type    json.RawMessage `json:"type"`
	Map     json.RawMessage `json:"map"`
	Flags   []string        `json:"flags"`
	Timeout int64           `json:"timeout"`
	Elem    []any           `json:"elem"`
	Comment string          `json:"comment"`
}

type jsonRule struct {
	Family  string `json:"family"`
	Table   string `json:"table"`
	Chain   string `json:"chain"`
	Expr    []any  `json:"expr"`
	Comment string `json:"comment"`
}

// jsonToText rewrites nft JSON as nft commands.
func jsonToText(src []byte) (string, error) {
	var rs jsonRuleset
	dec := json.NewDecoder(bytes.NewReader(src))
	dec.UseNumber()
	if err := dec.Decode(&rs); err != nil {
		return "", &CompileError{Rule: -1, Msg: "bad nft JSON", Err: err}
	}
	var b strings.Builder
	ruleIx := map[string]int{}
	for _, obj := range rs.Nftables {
		for kind, raw := range obj {
			var err error
			switch kind {
			case "table":
				var t jsonTable
				if err = json.Unmarshal(raw, &t); err == nil {
					fmt.Fprintf(&b, "add table %s %s", t.Family, quoteName(t.Name))
					if len(t.Flags) > 0 {
						fmt.Fprintf(&b, " { flags %s ; }", strings.Join(t.Flags, ","))
					}
					b.WriteByte('\n')
				}
			case "chain":
				var c jsonChain
				if err = json.Unmarshal(raw, &c); err == nil {
					fmt.Fprintf(&b, "add chain %s %s %s", c.Family, quoteName(c.Table), quoteName(c.Name))
					if c.Hook != "" && c.Prio != nil {
						fmt.Fprintf(&b, " { type %s hook %s%s priority %d ; policy %s ; }", c.Type, c.Hook, jsonDevices(c.Dev), *c.Prio, c.Policy)
					}
					b.WriteByte('\n')
				}
			case "set", "map":
				err = jsonSetText(&b, kind, raw)
			case "rule":
				var r jsonRule
				if err = unmarshalNumbers(raw, &r); err == nil {
					id := r.Family + " " + r.Table + " " + r.Chain
					ix := ruleIx[id]
					ruleIx[id]++
					var stmts []string
					for _, e := range r.Expr {
						s, serr := jsonStmt(e)
						if serr != nil {
							return "", &CompileError{Table: r.Family + " " + r.Table, Chain: r.Chain, Rule: ix, Msg: "JSON: " + serr.Error()}
						}
						if s != "" {
							stmts = append(stmts, s)
						}
					}
					if r.Comment != "" {
						stmts = append(stmts, "comment "+strconv.Quote(r.Comment))
					}
					fmt.Fprintf(&b, "add rule %s %s %s %s\n", r.Family, quoteName(r.Table), quoteName(r.Chain), strings.Join(stmts, " "))
				}
			case "metainfo", "ct helper", "ct timeout", "ct expectation", "counter", "limit", "quota", "flowtable":
				// Objects that do not shape a packet's path (the rules that use limits
				// and quotas fork).
			default:
				return "", &CompileError{Rule: -1, Msg: fmt.Sprintf("JSON: unsupported object %q", kind)}
			}
			if err != nil {
				return "", &CompileError{Rule: -1, Msg: "JSON " + kind, Err: err}
			}
		}
	}
	return b.String(), nil
}

func unmarshalNumbers(raw json.RawMessage, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	return dec.Decode(v)
}

// jsonSetText writes a set or map declaration and its elements.
func jsonSetText(b *strings.Builder, kind string, raw json.RawMessage) error {
	var s jsonSet
	if err := unmarshalNumbers(raw, &s); err != nil {
		return err
	}
	typ, err := jsonTypeText(s.Type)
	if err != nil {
		return err
	}
	fmt.Fprintf(b, "add %s %s %s %s { type %s", kind, s.Family, quoteName(s.Table), quoteName(s.Name), typ)
	if kind == "map" {
		data, err := jsonTypeText(s.Map)
		if err != nil {
			return err
		}
		fmt.Fprintf(b, " : %s", data)
	}
	b.WriteString(" ;")
	if len(s.Flags) > 0 {
		fmt.Fprintf(b, " flags %s ;", strings.Join(s.Flags, ","))
	}
	if s.Timeout > 0 {
		fmt.Fprintf(b, " timeout %ds ;", s.Timeout)
	}
	if s.Comment != "" {
		fmt.Fprintf(b, " comment %s ;", strconv.Quote(s.Comment))
	}
	b.WriteString(" }\n")
	if len(s.Elem) == 0 {
		return nil
	}
	var elems []string
	for _, e := range s.Elem {
		var txt string
		if pair, ok := e.([]any); ok && len(pair) == 2 {
			k, err := jsonValue(pair[0])
			if err != nil {
				return err
			}
			d, err := jsonData(pair[1])
			if err != nil {
				return err
			}
			txt = k + " : " + d
		} else {
			k, err := jsonValue(e)
			if err != nil {
				return err
			}
			txt = k
		}
		elems = append(elems, txt)
	}
	fmt.Fprintf(b, "add element %s %s %s { %s }\n", s.Family, quoteName(s.Table), quoteName(s.Name), strings.Join(elems, ", "))
	return nil
}

// jsonTypeText renders a set's key or data type: "ipv4_addr" or a concatenation.
// JSON has no typeof: a field declared by an integer expression ("typeof ... .
// numgen random mod 2") is a bare "integer", which the simulator reads as 32 bits
// (mark, the width of numgen, meta and ct marks).
func jsonTypeText(raw json.RawMessage) (string, error) {
	var many []string
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		many = []string{one}
	} else if err := json.Unmarshal(raw, &many); err != nil {
		return "", fmt.Errorf("bad type %s", raw)
	}
	for i, t := range many {
		if t == "integer" {
			many[i] = "mark"
		}
	}
	return strings.Join(many, " . "), nil
}

// quoteName quotes an object name when nft text needs it.
func quoteName(s string) string {
	if s == "" || strings.ContainsAny(s, " \t\"{};,#") {
		return strconv.Quote(s)
	}
	return s
}

// quoteValue quotes a string value (an interface name, a time) when it would not
// read back as one word.
func quoteValue(s string) string {
	if s == "" || strings.ContainsAny(s, " \t\"{}(),;#&|^!=<>") {
		return strconv.Quote(s)
	}
	return s
}

// jsonStmt renders one statement of a rule's "expr" array.
func jsonStmt(e any) (string, error) {
	if txt, ok := e.(string); ok {
		// nft prints a statement it has no JSON form for (a map update) as its text.
		return txt, nil
	}
	m, ok := e.(map[string]any)
	if !ok || len(m) != 1 {
		return "", fmt.Errorf("bad statement %v", e)
	}
	for k, v := range m {
		arg, _ := v.(map[string]any)
		switch k {
		case "match":
			return jsonMatch(arg)
		case "accept", "drop", "continue", "return", "notrack":
			return k, nil
		case "jump", "goto":
			return k + " " + quoteName(str(arg["target"])), nil
		case "counter":
			if name, ok := v.(string); ok {
				return "counter name " + quoteValue(name), nil
			}
			return "counter", nil
		case "log":
			s := "log"
			if p, ok := arg["prefix"]; ok {
				s += " prefix " + strconv.Quote(str(p))
			}
			if g, ok := arg["group"]; ok {
				s += " group " + str(g)
			}
			return s, nil
		case "reject":
			if arg == nil {
				return "reject", nil
			}
			t := str(arg["type"])
			if t == "tcp reset" {
				return "reject with tcp reset", nil
			}
			if x, ok := arg["expr"]; ok {
				if str(x) == "port-unreachable" {
					// The family's default, which nft's text listing leaves out.
					return "reject", nil
				}
				return "reject with " + t + " " + str(x), nil
			}
			return "reject", nil
		case "dnat", "snat", "masquerade", "redirect":
			return jsonNat(k, arg)
		case "mangle":
			key, err := jsonExpr(arg["key"])
			if err != nil {
				return "", err
			}
			val, err := jsonOperand(arg["value"])
			if err != nil {
				return "", err
			}
			return key + " set " + val, nil
		case "set":
			elem, err := jsonValue(arg["elem"])
			if err != nil {
				return "", err
			}
			stmts, err := jsonElemStmts(arg["stmt"])
			if err != nil {
				return "", err
			}
			return str(arg["op"]) + " " + str(arg["set"]) + " { " + elem + stmts + " }", nil
		case "vmap":
			key, err := jsonExpr(arg["key"])
			if err != nil {
				return "", err
			}
			data, err := jsonData(arg["data"])
			if err != nil {
				return "", err
			}
			return key + " vmap " + data, nil
		case "xt":
			return "xt " + str(arg["type"]) + " " + strconv.Quote(str(arg["name"])), nil
		case "limit":
			s := "limit rate "
			if arg["inv"] == true {
				s += "over "
			}
			if u := str(arg["rate_unit"]); u != "" && u != "packets" {
				s += str(arg["rate"]) + " " + u + "/" + str(arg["per"])
			} else {
				s += str(arg["rate"]) + "/" + str(arg["per"])
			}
			if bu := str(arg["burst"]); bu != "" && bu != "0" && bu != "5" {
				s += " burst " + bu + " packets"
			}
			return s, nil
		case "quota":
			if name, ok := v.(string); ok {
				return "quota name " + strconv.Quote(name), nil
			}
			s := "quota "
			if arg["inv"] == true {
				s += "over "
			}
			return s + str(arg["val"]) + " " + str(arg["val_unit"]), nil
		case "ct count":
			s := "ct count "
			if arg["inv"] == true {
				s += "over "
			}
			return s + str(arg["val"]), nil
		case "ct helper":
			return "ct helper set " + strconv.Quote(str(v)), nil
		case "flow":
			return "flow " + str(arg["op"]) + " " + str(arg["flowtable"]), nil
		case "queue":
			s := "queue"
			if n := str(arg["num"]); n != "" {
				s += " num " + n
			}
			return s, nil
		}
		if s, ok, err := jsonStmtMore(k, arg); ok {
			return s, err
		}
		return "", fmt.Errorf("unsupported statement %q", k)
	}
	return "", nil
}

func str(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case json.Number:
		return v.String()
	case bool:
		return strconv.FormatBool(v)
	case nil:
		return ""
	}
	return fmt.Sprint(v)
}

func jsonMatch(m map[string]any) (string, error) {
	left, err := jsonExpr(m["left"])
	if err != nil {
		return "", err
	}
	right, err := jsonValue(m["right"])
	if err != nil {
		return "", err
	}
	switch op := str(m["op"]); op {
	case "in":
		return left + " " + right, nil
	case "==":
		if r, ok := m["right"].(map[string]any); ok {
			if _, set := r["set"]; set {
				return left + " " + right, nil
			}
		}
		if isBitmaskJSON(m["left"]) {
			return left + " == " + right, nil
		}
		return left + " " + right, nil
	case "!=", "<", ">", "<=", ">=":
		return left + " " + op + " " + right, nil
	default:
		return "", fmt.Errorf("unsupported match operator %q", op)
	}
}

// isBitmaskJSON reports whether e loads a bitmask (ct state, ct status, tcp flags),
// whose implicit match means "any of": an exact "==" must stay explicit.
func isBitmaskJSON(e any) bool {
	m, _ := e.(map[string]any)
	if ct, ok := m["ct"].(map[string]any); ok {
		k := str(ct["key"])
		return k == "state" || k == "status"
	}
	if p, ok := m["payload"].(map[string]any); ok {
		return str(p["protocol"]) == "tcp" && str(p["field"]) == "flags"
	}
	return false
}

// jsonExpr renders an expression that loads a value.
func jsonExpr(e any) (string, error) {
	m, ok := e.(map[string]any)
	if !ok || len(m) != 1 {
		return "", fmt.Errorf("bad expression %v", e)
	}
	for k, v := range m {
		arg, _ := v.(map[string]any)
		switch k {
		case "payload":
			if _, raw := arg["base"]; raw {
				return "", fmt.Errorf("raw payload expressions are not supported")
			}
			return str(arg["protocol"]) + " " + str(arg["field"]), nil
		case "meta":
			return "meta " + str(arg["key"]), nil
		case "ct":
			s := "ct "
			if d := str(arg["dir"]); d != "" {
				s += d + " "
			}
			if f := str(arg["family"]); f != "" {
				s += f + " "
			}
			return s + str(arg["key"]), nil
		case "fib":
			flags, _ := arg["flags"].([]any)
			var parts []string
			for _, f := range flags {
				parts = append(parts, str(f))
			}
			return "fib " + strings.Join(parts, " . ") + " " + str(arg["result"]), nil
		case "numgen":
			s := "numgen " + str(arg["mode"]) + " mod " + str(arg["mod"])
			if o := str(arg["offset"]); o != "" && o != "0" {
				s += " offset " + o
			}
			return s, nil
		case "concat":
			parts, _ := v.([]any)
			var out []string
			for _, p := range parts {
				s, err := jsonExpr(p)
				if err != nil {
					return "", err
				}
				out = append(out, s)
			}
			return strings.Join(out, " . "), nil
		case "&", "|", "^", "<<", ">>":
			pair, _ := v.([]any)
			if len(pair) != 2 {
				return "", fmt.Errorf("bad %s expression", k)
			}
			x, err := jsonExpr(pair[0])
			if err != nil {
				return "", err
			}
			y, err := jsonOperand(pair[1])
			if err != nil {
				return "", err
			}
			return x + " " + k + " " + y, nil
		case "map":
			key, err := jsonExpr(arg["key"])
			if err != nil {
				return "", err
			}
			data, err := jsonData(arg["data"])
			if err != nil {
				return "", err
			}
			return key + " map " + data, nil
		case "tcp option":
			return "tcp option " + str(arg["name"]) + " " + str(arg["field"]), nil
		case "rt":
			return "rt " + str(arg["key"]), nil
		case "exthdr":
			return str(arg["name"]) + " " + str(arg["field"]), nil
		case "socket":
			return "socket " + str(arg["key"]), nil
		case "osf":
			s := "osf "
			if t := str(arg["ttl"]); t != "" {
				s += "ttl " + t + " "
			}
			return s + str(arg["key"]), nil
		}
		if k == "jhash" || k == "symhash" {
			return jsonHash(k, arg)
		}
		return "", fmt.Errorf("unsupported expression %q", k)
	}
	return "", nil
}

// jsonOperand renders the right side of a bitwise operation or a set statement's
// value: a constant, a list of flags ("(fin | syn)") or an expression.
func jsonOperand(v any) (string, error) {
	switch v := v.(type) {
	case []any:
		var parts []string
		for _, p := range v {
			parts = append(parts, str(p))
		}
		return "(" + strings.Join(parts, " | ") + ")", nil
	case map[string]any:
		if _, isSet := v["set"]; !isSet {
			if _, isPrefix := v["prefix"]; !isPrefix {
				if _, isRange := v["range"]; !isRange {
					return jsonExpr(v)
				}
			}
		}
	}
	return jsonValue(v)
}

// jsonValue renders a constant: a value, a set, a prefix, a range, a concatenation,
// an element with options.
func jsonValue(v any) (string, error) {
	switch v := v.(type) {
	case string:
		return quoteValue(v), nil
	case json.Number:
		return v.String(), nil
	case bool:
		if v {
			return "exists", nil
		}
		return "missing", nil
	case []any:
		// A list of flags or states: "established,related".
		var parts []string
		for _, p := range v {
			parts = append(parts, str(p))
		}
		return strings.Join(parts, ","), nil
	case map[string]any:
		for k, x := range v {
			switch k {
			case "set":
				items, ok := x.([]any)
				if !ok {
					return jsonValue(x)
				}
				var parts []string
				for _, it := range items {
					var s string
					var err error
					if pair, ok := it.([]any); ok && len(pair) == 2 {
						var k2, d string
						if k2, err = jsonValue(pair[0]); err == nil {
							d, err = jsonData(pair[1])
						}
						s = k2 + " : " + d
					} else {
						s, err = jsonValue(it)
					}
					if err != nil {
						return "", err
					}
					parts = append(parts, s)
				}
				return "{ " + strings.Join(parts, ", ") + " }", nil
			case "prefix":
				p, _ := x.(map[string]any)
				return str(p["addr"]) + "/" + str(p["len"]), nil
			case "range":
				r, _ := x.([]any)
				if len(r) != 2 {
					return "", fmt.Errorf("bad range %v", x)
				}
				return str(r[0]) + "-" + str(r[1]), nil
			case "concat":
				parts, _ := x.([]any)
				var out []string
				for _, p := range parts {
					s, err := jsonValue(p)
					if err != nil {
						return "", err
					}
					out = append(out, s)
				}
				return strings.Join(out, " . "), nil
			case "elem":
				el, _ := x.(map[string]any)
				s, err := jsonValue(el["val"])
				if err != nil {
					return "", err
				}
				if t := str(el["timeout"]); t != "" {
					s += " timeout " + t + "s"
				}
				if ex := str(el["expires"]); ex != "" {
					s += " expires " + ex + "s"
				}
				if c := str(el["comment"]); c != "" {
					s += " comment " + strconv.Quote(c)
				}
				return s, nil
			}
		}
		// An expression where a value was expected (set updates, map keys).
		return jsonExpr(v)
	}
	return "", fmt.Errorf("bad value %v", v)
}

// jsonData renders map data: a verdict, a value, or a reference to a map.
func jsonData(v any) (string, error) {
	if s, ok := v.(string); ok && strings.HasPrefix(s, "@") {
		return s, nil
	}
	if m, ok := v.(map[string]any); ok {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		if len(keys) == 1 {
			switch keys[0] {
			case "accept", "drop", "continue", "return":
				return keys[0], nil
			case "jump", "goto":
				arg, _ := m[keys[0]].(map[string]any)
				return keys[0] + " " + quoteName(str(arg["target"])), nil
			}
		}
	}
	return jsonValue(v)
}

// jsonNat renders dnat, snat, masquerade and redirect.
func jsonNat(kind string, arg map[string]any) (string, error) {
	s := kind
	if f := str(arg["family"]); f != "" && (kind == "dnat" || kind == "snat") {
		s += " " + f
	}
	port := ""
	if p, ok := arg["port"]; ok {
		v, err := jsonValue(p)
		if err != nil {
			return "", err
		}
		port = v
	}
	if a, ok := arg["addr"]; ok {
		var addr string
		switch a := a.(type) {
		case string:
			addr = a
			if strings.Contains(a, ":") && port != "" {
				addr = "[" + a + "]"
			}
		default:
			v, err := jsonOperand(a)
			if err != nil {
				return "", err
			}
			addr = v
		}
		s += " to " + addr
		if port != "" {
			s += ":" + port
		}
	} else if port != "" {
		s += " to :" + port
	}
	switch f := arg["flags"].(type) {
	case string:
		s += " " + f
	case []any:
		var fl []string
		for _, x := range f {
			fl = append(fl, str(x))
		}
		s += " " + strings.Join(fl, ",")
	}
	return s, nil
}
