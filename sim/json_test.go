package sim

import (
	"errors"
	"strings"
	"testing"
)

// jsonSample is what nft 1.0.6 prints with -j for a small table (trimmed of
// handles), covering the JSON forms the rewriting must get right.
const jsonSample = `{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}},
{"table": {"family": "inet", "name": "t", "handle": 1}},
{"ct helper": {"family": "inet", "name": "ftp", "table": "t", "handle": 2, "type": "ftp", "protocol": "tcp", "l3proto": "inet"}},
{"set": {"family": "inet", "name": "allowed", "table": "t", "type": ["ipv4_addr", "inet_service"], "handle": 3, "flags": ["interval"], "elem": [{"concat": [{"prefix": {"addr": "10.0.0.0", "len": 8}}, {"range": [1, 1024]}]}]}},
{"map": {"family": "inet", "name": "ports", "table": "t", "type": "inet_service", "handle": 4, "map": "verdict", "elem": [[22, {"accept": null}], [{"elem": {"val": 23, "comment": "telnet"}}, {"drop": null}]]}},
{"chain": {"family": "inet", "table": "t", "name": "in", "handle": 5, "type": "filter", "hook": "input", "prio": 0, "policy": "drop"}},
{"chain": {"family": "inet", "table": "t", "name": "pre", "handle": 6, "type": "filter", "hook": "prerouting", "prio": -300, "policy": "accept"}},
{"rule": {"family": "inet", "table": "t", "chain": "pre", "handle": 7, "expr": [{"match": {"op": "==", "left": {"meta": {"key": "nfproto"}}, "right": "ipv4"}}, {"match": {"op": "==", "left": {"fib": {"result": "oif", "flags": ["saddr", "mark", "iif"]}}, "right": false}}, {"drop": null}]}},
{"rule": {"family": "inet", "table": "t", "chain": "in", "handle": 8, "expr": [{"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": ["established", "related"]}}, {"accept": null}]}},
{"rule": {"family": "inet", "table": "t", "chain": "in", "handle": 9, "expr": [{"match": {"op": "==", "left": {"&": [{"payload": {"protocol": "tcp", "field": "flags"}}, ["fin", "syn", "rst", "ack"]]}, "right": "syn"}}, {"match": {"op": "==", "left": {"concat": [{"payload": {"protocol": "ip", "field": "saddr"}}, {"payload": {"protocol": "tcp", "field": "dport"}}]}, "right": "@allowed"}}, {"xt": {"type": "match", "name": "comment"}}, {"counter": {"packets": 0, "bytes": 0}}, {"accept": null}]}},
{"rule": {"family": "inet", "table": "t", "chain": "in", "handle": 10, "expr": [{"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": "eth0"}}, {"vmap": {"key": {"payload": {"protocol": "tcp", "field": "dport"}}, "data": "@ports"}}], "comment": "ssh and telnet"}},
{"rule": {"family": "inet", "table": "t", "chain": "in", "handle": 11, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "icmp", "field": "type"}}, "right": {"set": ["echo-request", "timestamp-request"]}}}, {"limit": {"rate": 10, "burst": 5, "per": "second"}}, {"accept": null}]}},
{"rule": {"family": "inet", "table": "t", "chain": "in", "handle": 12, "expr": [{"reject": {"type": "icmpx", "expr": "admin-prohibited"}}]}}
]}`

func TestCompileJSON(t *testing.T) {
	if _, err := CompileJSON([]byte(jsonSample), CompileOptions{}); err == nil || !strings.Contains(err.Error(), "limit rate 10/second") {
		t.Errorf("strict CompileJSON = %v, want the limit's error", err)
	}
	// CompileTextOptions reads JSON too, as nftrace --ruleset hands it any file.
	p, err := CompileTextOptions(jsonSample, CompileOptions{Forks: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ pkt, want string }{
		{"tcp 10.0.0.5:1 -> 192.168.0.2:80 iif eth0", "1 accept local 192.168.0.2:80"},
		{"tcp 10.0.0.5:1 -> 192.168.0.2:80 iif eth0 flags ack", "1 reject none 192.168.0.2:80 at in"},
		{"tcp 1.2.3.4:1 -> 192.168.0.2:22 iif eth0 flags ack", "1 accept local 192.168.0.2:22"},
		{"tcp 1.2.3.4:1 -> 192.168.0.2:23 iif eth0 flags ack", "1 drop none 192.168.0.2:23 at in"},
		{"tcp 1.2.3.4:1 -> 192.168.0.2:443 iif eth0 ct established", "1 accept local 192.168.0.2:443"},
		{"udp 10.1.0.5:1 -> 192.168.0.2:53 iif eth0", "1 drop none 192.168.0.2:53 at pre"},
		{"icmp 1.2.3.4 -> 192.168.0.2 iif eth0 type timestamp-request", "[over limit rate 10/second] 1 reject none 192.168.0.2 at in\n[under limit rate 10/second] 1 accept local 192.168.0.2"},
	} {
		tr := mustTrace(t, p, tc.pkt, realEnv)
		if got := strings.Join(summary(tr), "\n"); got != tc.want {
			t.Errorf("%s:\n got: %s\nwant: %s\n%s", tc.pkt, got, tc.want, tr)
		}
	}
}

func TestCompileJSONErrors(t *testing.T) {
	_, err := CompileJSON([]byte(`{"nftables": [{"table": {"family": "ip", "name": "t"}},
{"chain": {"family": "ip", "table": "t", "name": "c"}},
{"rule": {"family": "ip", "table": "t", "chain": "c", "expr": [{"accept": null}]}},
{"rule": {"family": "ip", "table": "t", "chain": "c", "expr": [{"match": {"op": "==", "left": {"payload": {"base": "nh", "offset": 96, "len": 32}}, "right": 1}}]}}]}`), CompileOptions{})
	var ce *CompileError
	if !errors.As(err, &ce) || ce.Table != "ip t" || ce.Chain != "c" || ce.Rule != 1 || !strings.Contains(ce.Msg, "raw payload") {
		t.Errorf("error = %#v", err)
	}
	if _, err := CompileJSON([]byte(`{"nftables": [{"synproxy": {"family": "ip", "name": "f"}}]}`), CompileOptions{}); err == nil || !strings.Contains(err.Error(), `unsupported object "synproxy"`) {
		t.Errorf("synproxy: error = %v", err)
	}
	if _, err := CompileJSON([]byte(`{"nftables": [`), CompileOptions{}); err == nil {
		t.Errorf("truncated JSON compiled")
	}
}
