package proxy_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// These tests need no root: they check how the path suite reads `nft monitor trace` and
// `nft -a list table` output (nft 1.0.6), on lines captured from the lab.

const sampleListing = `table ip nftproxy { # handle 7
	comment "nftproxy: Kubernetes Service proxy"
	set cluster-ips { # handle 1
		type ipv4_addr
		elements = { 172.30.0.10 }
	}

	chain filter-prerouting { # handle 20
		type filter hook prerouting priority dstnat - 10; policy accept;
		ct state new jump firewall-check # handle 41
	}

	chain firewall-check { # handle 21
		ip daddr . meta l4proto . th dport vmap @firewall-ips # handle 42
	}

	chain nat-prerouting { # handle 22
		type nat hook prerouting priority dstnat; policy accept;
		jump services # handle 43
	}

	chain services { # handle 23
		ip daddr @cluster-ips ip saddr != 10.0.0.0/8 jump mark-for-masquerade # handle 44
		ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports # handle 45
	}

	chain nodeport-dnat-1 { # handle 24
		meta l4proto { tcp, udp, sctp } dnat ip to meta l4proto . th dport . numgen random mod 1 map @nodeport-backends # handle 46
	}

	chain filter-forward { # handle 25
		type filter hook forward priority -110; policy accept;
		ct state new jump service-endpoints-check # handle 47
		ct state new jump cluster-ips-check # handle 48
	}

	chain cluster-ips-check { # handle 26
		ip daddr @cluster-ips reject # handle 49
		ip daddr 172.30.0.0/16 drop # handle 50
	}
}
`

var sampleTrace = []string{
	`trace id d8e0b918 inet nftproxy-trace pre packet: iif "eth0" ether saddr 86:2a:96:53:91:1f ether daddr 2e:87:a6:c1:3d:9b ip saddr 192.168.10.2 ip daddr 192.168.10.1 ip dscp cs0 ip ecn not-ect ip ttl 64 ip id 26478 ip protocol tcp ip length 60 tcp sport 40001 tcp dport 30080 tcp flags == syn tcp window 64240 `,
	`trace id d8e0b918 inet nftproxy-trace pre rule tcp sport 40000-40999 tcp flags syn / syn,ack meta nftrace set 1 (verdict continue)`,
	`trace id d8e0b918 inet nftproxy-trace pre policy accept `,
	`trace id d8e0b918 ip nftproxy filter-prerouting packet: iif "eth0" ether saddr 86:2a:96:53:91:1f ether daddr 2e:87:a6:c1:3d:9b ip saddr 192.168.10.2 ip daddr 192.168.10.1 ip dscp cs0 ip ecn not-ect ip ttl 64 ip id 26478 ip length 60 tcp sport 40001 tcp dport 30080 tcp flags == syn tcp window 64240 `,
	`trace id d8e0b918 ip nftproxy filter-prerouting rule ct state new jump firewall-check (verdict jump firewall-check)`,
	`trace id d8e0b918 ip nftproxy filter-prerouting policy accept `,
	`trace id d8e0b918 ip nftproxy nat-prerouting packet: iif "eth0" ether saddr 86:2a:96:53:91:1f ether daddr 2e:87:a6:c1:3d:9b ip saddr 192.168.10.2 ip daddr 192.168.10.1 ip dscp cs0 ip ecn not-ect ip ttl 64 ip id 26478 ip length 60 tcp sport 40001 tcp dport 30080 tcp flags == syn tcp window 64240 `,
	`trace id d8e0b918 ip nftproxy nat-prerouting rule jump services (verdict jump services)`,
	`trace id d8e0b918 ip nftproxy services rule ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports (verdict goto nodeport-dnat-1)`,
	`trace id d8e0b918 ip nftproxy nodeport-dnat-1 rule meta l4proto { tcp, udp, sctp } dnat ip to meta l4proto . th dport . numgen random mod 1 map @nodeport-backends (verdict accept)`,
	// Another packet's events in between: a different trace id.
	`trace id 6434e77d inet nftproxy-trace pre packet: iif "veth1" ip saddr 10.0.1.7 ip daddr 172.30.0.99 ip protocol tcp tcp sport 40005 tcp dport 81 tcp flags == syn`,
	`trace id d8e0b918 ip nftproxy filter-forward packet: iif "eth0" oif "veth0" ether saddr 86:2a:96:53:91:1f ether daddr 2e:87:a6:c1:3d:9b ip saddr 192.168.10.2 ip daddr 10.0.1.5 ip dscp cs0 ip ecn not-ect ip ttl 63 ip id 26478 ip length 60 tcp sport 40001 tcp dport 8080 tcp flags == syn tcp window 64240 `,
	`trace id d8e0b918 ip nftproxy filter-forward rule ct state new jump service-endpoints-check (verdict jump service-endpoints-check)`,
	`trace id d8e0b918 ip nftproxy filter-forward rule ct state new jump cluster-ips-check (verdict jump cluster-ips-check)`,
	`trace id d8e0b918 ip nftproxy filter-forward policy accept meta mark 0x00004000 `,
	`trace id 6434e77d ip nftproxy filter-forward packet: iif "veth1" oif "void0" ip saddr 10.0.1.7 ip daddr 172.30.0.99 tcp sport 40005 tcp dport 81 tcp flags == syn`,
	`trace id 6434e77d ip nftproxy cluster-ips-check rule ip daddr 172.30.0.0/16 drop (verdict drop)`,
	`not a trace line`,
}

func TestParseListing(t *testing.T) {
	ls := parseListing(sampleListing)
	wantHooks := map[string]string{"filter-prerouting": "prerouting", "nat-prerouting": "prerouting", "filter-forward": "forward"}
	if diff := cmp.Diff(wantHooks, ls.hooks); diff != "" {
		t.Errorf("hooks (-want +got):\n%s", diff)
	}
	if got, want := ls.rules["cluster-ips-check"], []string{"ip daddr @cluster-ips reject", "ip daddr 172.30.0.0/16 drop"}; !cmp.Equal(got, want) {
		t.Errorf("rules of cluster-ips-check = %q, want %q", got, want)
	}
	if _, ok := ls.rules["cluster-ips"]; ok {
		t.Errorf("a set was taken for a chain")
	}
}

func TestKernelPath(t *testing.T) {
	byPort := kernelPackets(sampleTrace)
	if len(byPort) != 2 {
		t.Fatalf("got %d packets, want 2", len(byPort))
	}
	listings := map[string]listing{"ip": parseListing(sampleListing)}
	got := formatPath(kernelPath(byPort[40001], listings))
	want := `hook prerouting: tcp 192.168.10.2:40001 -> 192.168.10.1:30080 iif eth0
  ip filter-prerouting
    filter-prerouting[0] -> jump firewall-check   # ct state new jump firewall-check
    filter-prerouting policy accept
  ip nat-prerouting
    nat-prerouting[0] -> jump services   # jump services
    services[1] -> goto nodeport-dnat-1   # ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports
    nodeport-dnat-1[0] -> accept   # meta l4proto { tcp, udp, sctp } dnat ip to meta l4proto . th dport . numgen random mod 1 map @nodeport-backends
hook forward: tcp 192.168.10.2:40001 -> 10.0.1.5:8080 iif eth0 oif veth0
  ip filter-forward
    filter-forward[0] -> jump service-endpoints-check   # ct state new jump service-endpoints-check
    filter-forward[1] -> jump cluster-ips-check   # ct state new jump cluster-ips-check
    filter-forward policy accept
`
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("path (-want +got):\n%s", diff)
	}
	got = formatPath(kernelPath(byPort[40005], listings))
	want = `hook forward: tcp 10.0.1.7:40005 -> 172.30.0.99:81 iif veth1 oif void0
  ip filter-forward
    cluster-ips-check[1] -> drop   # ip daddr 172.30.0.0/16 drop
`
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("path of the second packet (-want +got):\n%s", diff)
	}
}

func TestPathsDifferOnRuleAndVerdict(t *testing.T) {
	listings := map[string]listing{"ip": parseListing(sampleListing)}
	kpath := kernelPath(kernelPackets(sampleTrace)[40001], listings)
	other := append([]hop(nil), kpath...)
	other[6].rule = 0
	if pathsEqual(kpath, other) {
		t.Errorf("paths with different rules compare equal")
	}
	out := sideBySide("kernel", kpath, "simulator", other)
	if !strings.Contains(out, "! ") || !strings.Contains(out, "row 7, kernel: services[1] is: ip daddr @nodeport-ips") {
		t.Errorf("side by side view does not point at the difference:\n%s", out)
	}
	other = append([]hop(nil), kpath...)
	other[len(other)-1].verdict = "drop"
	if pathsEqual(kpath, other) {
		t.Errorf("paths with different verdicts compare equal")
	}
	if pathsEqual(kpath, kpath[:len(kpath)-1]) {
		t.Errorf("a path compares equal to its prefix")
	}
}
