package sim

import (
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/testenv"
)

// More nodes' rulesets, as nft 1.0.6 lists them: a Canal node (Flannel's masquerade
// and forwarding, Calico-style policy with mark bits and a reverse path check;
// testdata/canal.sh through iptables-nft), ufw beside Podman's netavark
// (testdata/ufw-podman.sh: iptables-nft and netavark's own nftables table), and a
// distribution's default server firewall, hardened (testdata/server.nft: synproxy,
// a meter, tcp options, a conntrack zone, a netdev ingress chain).

// nodesEnv is the node of these fixtures: eth0 to the world, Calico workloads
// caliweb and calidb, Flannel's VXLAN to the other nodes' pods, Podman's bridge.
var nodesEnv = Env{
	LocalAddrs: []netip.Addr{netip.MustParseAddr("192.168.0.2"), netip.MustParseAddr("fd00::2")},
	Routes: []Route{
		{Prefix: netip.MustParsePrefix("10.244.1.5/32"), Dev: "caliweb"},
		{Prefix: netip.MustParsePrefix("10.244.1.6/32"), Dev: "calidb"},
		{Prefix: netip.MustParsePrefix("10.244.0.0/16"), Dev: "flannel.1"},
		{Prefix: netip.MustParsePrefix("10.88.0.0/16"), Dev: "podman0"},
		{Prefix: netip.MustParsePrefix("0.0.0.0/0"), Dev: "eth0", Src: netip.MustParseAddr("192.168.0.2")},
		{Prefix: netip.MustParsePrefix("fd00::/64"), Dev: "eth0"},
	},
}

// nodePrograms compiles a fixture listing with forks, and, as root, the listing the
// kernel prints after running script (a file of testdata, run with sh) in a
// throwaway network namespace.
func nodePrograms(t *testing.T, listing, script string) map[string]*Program {
	t.Helper()
	src, err := os.ReadFile("testdata/" + listing)
	if err != nil {
		t.Fatal(err)
	}
	progs := map[string]*Program{}
	forms := map[string]string{"list": string(src)}
	if _, ok := kernelListing(t, "testdata/firewall.dump.nft"); ok {
		if m := testenv.Missing("iptables-nft"); m != "" {
			t.Logf("not running %s: %s", script, m)
		} else {
			out, err := exec.Command("unshare", "-n", "sh", "-c", script+` && nft list ruleset`).CombinedOutput()
			if err != nil {
				t.Fatalf("%s: %v\n%s", script, err, out)
			}
			forms["kernel"] = string(out)
		}
	}
	for form, text := range forms {
		p, err := CompileTextOptions(text, CompileOptions{Forks: true})
		if err != nil {
			t.Fatalf("%s (%s): %v", listing, form, err)
		}
		progs[form] = p
	}
	return progs
}

func TestCanal(t *testing.T) {
	progs := nodePrograms(t, "canal.list.nft", "sh testdata/canal.sh")
	// Nothing in it needs an assumption.
	src, _ := os.ReadFile("testdata/canal.list.nft")
	if _, err := CompileText(string(src)); err != nil {
		t.Errorf("strict CompileText(canal.list.nft): %v", err)
	}
	runRealEnv(t, progs, nodesEnv, []realCase{
		{"pod to the world: policy accepts, Flannel masquerades", "tcp 10.244.1.5:40000 -> 8.8.8.8:53 iif caliweb", []string{"1 accept forward 8.8.8.8:53 masq"}},
		{"pod to a pod on another node: not masqueraded", "tcp 10.244.1.5:40000 -> 10.244.2.7:80 iif caliweb", []string{"1 accept forward 10.244.2.7:80"}},
		{"to the pod's allowed port", "tcp 192.168.0.9:40000 -> 10.244.1.5:80 iif eth0", []string{"1 accept forward 10.244.1.5:80"}},
		{"to a port the pod's policy does not allow", "tcp 192.168.0.9:40000 -> 10.244.1.5:22 iif eth0", []string{"1 drop none 10.244.1.5:22 at cali-tw-caliweb"}},
		{"established reply to the pod", "tcp 8.8.8.8:53 -> 10.244.1.5:40000 iif eth0 ct established", []string{"1 accept forward 10.244.1.5:40000"}},
		{"spoofed source from a workload fails the reverse path check", "tcp 10.244.9.9:40000 -> 8.8.8.8:53 iif caliweb", []string{"1 drop none 8.8.8.8:53 at cali-PREROUTING"}},
		{"a workload interface Calico does not know", "tcp 10.244.1.7:40000 -> 8.8.8.8:53 iif calixyz", []string{"1 drop none 8.8.8.8:53 at cali-PREROUTING"}},
		{"a pod of another workload to an unknown workload", "tcp 10.244.1.6:40000 -> 8.8.8.8:53 iif calidb", []string{"1 drop none 8.8.8.8:53 at cali-from-wl-dispatch"}},
	})
}

func TestUfwPodman(t *testing.T) {
	progs := nodePrograms(t, "ufw-podman.list.nft", "sh testdata/ufw-podman.sh")
	src, _ := os.ReadFile("testdata/ufw-podman.list.nft")
	if _, err := CompileText(string(src)); err == nil || !strings.Contains(err.Error(), "limit rate 3/minute burst 10 packets") {
		t.Errorf("strict CompileText(ufw-podman.list.nft) = %v, want an error on ufw's logging limit", err)
	}
	const (
		under = "under limit rate 3/minute burst 10 packets"
		over  = "over limit rate 3/minute burst 10 packets"
	)
	runRealEnv(t, progs, nodesEnv, []realCase{
		{"ssh", "tcp 1.2.3.4:5555 -> 192.168.0.2:22 iif eth0", []string{"1 accept local 192.168.0.2:22"}},
		{"any other port: logged (under ufw's limit) and dropped by the policy", "tcp 1.2.3.4:5555 -> 192.168.0.2:80 iif eth0", []string{
			"[" + over + "] 1 drop none 192.168.0.2:80 at INPUT",
			"[" + under + "] 1 drop none 192.168.0.2:80 at INPUT",
		}},
		{"Podman's published port: netavark DNATs, ufw's routed policy drops", "tcp 1.2.3.4:5555 -> 192.168.0.2:8080 iif eth0", []string{
			"[" + over + "] 1 drop none 10.88.0.2:80 at FORWARD",
			"[" + under + "] 1 drop none 10.88.0.2:80 at FORWARD",
		}},
		{"a container to the world: dropped as routed too", "tcp 10.88.0.2:40000 -> 8.8.8.8:53 iif podman0", []string{
			"[" + over + "] 1 drop none 8.8.8.8:53 at FORWARD",
			"[" + under + "] 1 drop none 8.8.8.8:53 at FORWARD",
		}},
		{"an established reply to a container passes both tables", "tcp 8.8.8.8:53 -> 10.88.0.2:40000 iif eth0 ct established", []string{"1 accept forward 10.88.0.2:40000"}},
		{"the node's own DNS query", "udp 192.168.0.2:5555 -> 8.8.8.8:53", []string{"1 accept out 8.8.8.8:53"}},
		{"ping", "icmp 1.2.3.4 -> 192.168.0.2 iif eth0", []string{"1 accept local 192.168.0.2"}},
	})
}

func TestHardenedServer(t *testing.T) {
	progs := nodePrograms(t, "server.list.nft", "ip link add eth0 type veth peer name eth1 && nft -f testdata/server.nft")
	const (
		sshUnder = "under limit rate 10/minute for its element of @ssh_meter"
		sshOver  = "over limit rate 10/minute for its element of @ssh_meter"
		rejUnder = "under limit rate 5/second"
		rejOver  = "over limit rate 5/second"
	)
	runRealEnv(t, progs, nodesEnv, []realCase{
		{"ssh under and over the per-source meter", "tcp 1.2.3.4:5555 -> 192.168.0.2:22 iif eth0", []string{
			"[" + sshOver + "] 1 drop none 192.168.0.2:22 at input",
			"[" + sshUnder + "] 1 accept local 192.168.0.2:22",
		}},
		{"https SYN: untracked, answered by synproxy", "tcp 1.2.3.4:5555 -> 192.168.0.2:443 iif eth0", []string{"1 drop none 192.168.0.2:443 at input"}},
		{"DNS in its conntrack zone", "udp 1.2.3.4:5555 -> 192.168.0.2:53 iif eth0", []string{"1 accept local 192.168.0.2:53"}},
		{"Christmas-tree packet dropped at eth0's ingress", "tcp 1.2.3.4:5555 -> 192.168.0.2:22 iif eth0 flags fin,syn,rst,psh,ack,urg", []string{"1 drop none 192.168.0.2:22 at ingress_eth0"}},
		{"the same packet on another interface reaches the meter", "tcp 10.88.0.5:5555 -> 192.168.0.2:22 iif podman0 flags fin,syn,rst,psh,ack,urg", []string{
			"[" + sshOver + "] 1 drop none 192.168.0.2:22 at input",
			"[" + sshUnder + "] 1 accept local 192.168.0.2:22",
		}},
		{"ping", "icmp 1.2.3.4 -> 192.168.0.2 iif eth0", []string{"1 accept local 192.168.0.2"}},
		{"a closed port: rejected under the rate, dropped over it", "tcp 1.2.3.4:5555 -> 192.168.0.2:80 iif eth0", []string{
			"[" + rejOver + "] 1 drop none 192.168.0.2:80 at input",
			"[" + rejUnder + "] 1 reject none 192.168.0.2:80 at input",
		}},
		{"forwarding is dropped", "tcp 1.2.3.4:5555 -> 10.88.0.5:80 iif eth0", []string{"1 drop none 10.88.0.5:80 at forward"}},
	})
}
