package takeover

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os/exec"
	"strings"
	"testing"
)

// nftListingXT is `nft --json list table ip nat` of iptables-nft's rules, with the xt
// expressions of the matches nft does not translate.
const nftListingXT = `{"nftables": [{"metainfo": {"version": "1.0.6", "json_schema_version": 1}},
{"table": {"family": "ip", "name": "nat", "handle": 1}},
{"chain": {"family": "ip", "table": "nat", "name": "KUBE-SERVICES", "handle": 1}},
{"chain": {"family": "ip", "table": "nat", "name": "KUBE-SVC-X", "handle": 2}},
{"chain": {"family": "ip", "table": "nat", "name": "PREROUTING", "handle": 3, "type": "nat", "hook": "prerouting", "prio": -100, "policy": "accept"}},
{"chain": {"family": "ip", "table": "nat", "name": "DOCKER", "handle": 6}},
{"rule": {"family": "ip", "table": "nat", "chain": "KUBE-SERVICES", "handle": 5, "expr": [{"xt": {"type": "match", "name": "statistic"}}, {"counter": {"packets": 0, "bytes": 0}}, {"jump": {"target": "KUBE-SVC-X"}}]}},
{"rule": {"family": "ip", "table": "nat", "chain": "PREROUTING", "handle": 4, "expr": [{"xt": {"type": "match", "name": "comment"}}, {"counter": {"packets": 0, "bytes": 0}}, {"jump": {"target": "KUBE-SERVICES"}}]}},
{"rule": {"family": "ip", "table": "nat", "chain": "PREROUTING", "handle": 7, "expr": [{"xt": {"type": "match", "name": "addrtype"}}, {"goto": {"target": "DOCKER"}}]}}]}`

// TestNftScript: the listing's jump into kube-proxy's chains is deleted by handle and
// its chains flushed and deleted; Docker's jump and chain stay.
func TestNftScript(t *testing.T) {
	tb, err := ParseNftJSON("nat", []byte(nftListingXT))
	if err != nil {
		t.Fatal(err)
	}
	rm := Select(tb)
	got := nftScript("ip", "nat", ops{rules: rm.Rules, flush: rm.Chains, chain: rm.Chains})
	want := "delete rule ip nat PREROUTING handle 4\n" +
		"flush chain ip nat KUBE-SERVICES\nflush chain ip nat KUBE-SVC-X\n" +
		"delete chain ip nat KUBE-SERVICES\ndelete chain ip nat KUBE-SVC-X\n"
	if got != want {
		t.Errorf("script:\n%s\nwant:\n%s", got, want)
	}
	if _, err := ParseNftJSON("nat", []byte("Error: No such file")); err == nil || !strings.Contains(err.Error(), "nat") {
		t.Errorf("a listing that is not JSON: err %v, want one naming the table", err)
	}
}

// TestRestoreScript: iptables-legacy's removal deletes the jumps by their spec, quotes
// kept, in one commit after declaring (flushing) the chains.
func TestRestoreScript(t *testing.T) {
	tables := loadDump(t, "testdata/kube-proxy-ip6tables.save")
	rm := Select(tables["nat"])
	got := restoreScript("nat", ops{rules: rm.Rules, flush: rm.Chains, chain: rm.Chains})
	for _, line := range []string{"*nat\n:KUBE-MARK-MASQ - [0:0]\n",
		"\n-D PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n",
		"\n-X KUBE-SERVICES\nCOMMIT\n"} {
		if !strings.Contains(got, line) {
			t.Errorf("restore script lacks %q:\n%s", line, got)
		}
	}
	if strings.Contains(got, "DOCKER") || strings.Contains(got, "KUBELET") {
		t.Errorf("restore script touches others' chains:\n%s", got)
	}
}

// fakeNode answers Cleanup's commands from a listing of tables ip nat and ip6 filter,
// as nft does (the other tables do not exist), failing every nft transaction that
// deletes the chain fail. It knows no `nft list tables`.
type fakeNode struct {
	fail    string
	scripts []string
}

func (f *fakeNode) run(_ context.Context, stdin, name string, args ...string) ([]byte, error) {
	cmd := strings.Join(append([]string{name}, args...), " ")
	switch cmd {
	case "nft --json list table ip nat":
		return []byte(nftListingXT), nil
	case "nft --json list table ip6 filter":
		return []byte(`{"nftables": [{"chain": {"name": "INPUT", "hook": "input"}}]}`), nil
	case "nft -f -":
		f.scripts = append(f.scripts, stdin)
		if strings.Contains(stdin, "delete chain ip nat "+f.fail+"\n") {
			return nil, errors.New("Device or resource busy")
		}
		return nil, nil
	}
	if table, ok := strings.CutPrefix(cmd, "nft --json list table "); ok {
		out := "Error: No such file or directory\nlist table " + table + "\n"
		return []byte(out), errors.New("nft: exit status 1: " + out)
	}
	return nil, errors.New("unexpected command " + cmd)
}

// TestCleanupFailure: a chain that cannot be deleted is a warning and a counted failure;
// the rest is removed one by one, and the absent legacy backend is said in the log.
func TestCleanupFailure(t *testing.T) {
	f := &fakeNode{fail: "KUBE-SVC-X"}
	var log bytes.Buffer
	failed := map[string]int{}
	res := Cleanup(context.Background(), Config{
		Log: slog.New(slog.NewTextHandler(&log, nil)), Run: f.run,
		LookPath: func(name string) (string, error) {
			if strings.Contains(name, "legacy") {
				return "", exec.ErrNotFound
			}
			return name, nil
		},
		Failed: func(backend, family string) { failed[backend+" "+family]++ },
	})
	// At once (failed), the jump, the flush, KUBE-SERVICES, KUBE-SVC-X (failed).
	if res != (Result{Rules: 1, Chains: 1, Failures: 2}) || failed["iptables-nft IPv4"] != 2 || len(f.scripts) != 5 {
		t.Errorf("result %+v, failures %v, %d transactions; want 1 rule, 1 chain, 2 IPv4 failures of 5 transactions", res, failed, len(f.scripts))
	}
	for _, want := range []string{"level=WARN msg=\"kube-proxy's iptables cleanup: deleting chain KUBE-SVC-X of table nat\"",
		"msg=\"deleted kube-proxy's chain\" backend=iptables-nft ip_family=IPv4 table=nat chain=KUBE-SERVICES",
		"iptables-legacy-save or iptables-legacy-restore is not on PATH",
		"ip6tables-legacy-save or ip6tables-legacy-restore is not on PATH"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, log.String())
		}
	}
}
