package lab_test

import (
	"context"
	"fmt"
	"net/netip"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/e2e/lab"
)

// Example builds a node with two pods and an external client, DNATs a VIP to the pods in the
// node's namespace and sends a connection through it. It needs root, so it is not run.
func Example() {
	l, err := lab.New(lab.Spec{
		NodeAddrs: []netip.Prefix{netip.MustParsePrefix("192.168.10.1/24")},
		Pods: []lab.PodSpec{
			{Name: "pod-a", Addrs: []netip.Addr{netip.MustParseAddr("10.0.1.5")}},
			{Name: "pod-b", Addrs: []netip.Addr{netip.MustParseAddr("10.0.1.6")}},
		},
		Client: &lab.ClientSpec{Addrs: []netip.Prefix{netip.MustParsePrefix("192.168.10.2/24")}},
	})
	if err != nil {
		panic(err)
	}
	defer l.Close()

	nft, err := lab.NFT(l.Node, knftables.IPv4Family, "example") // runs nft inside the node
	if err != nil {
		panic(err)
	}
	tx := nft.NewTransaction()
	tx.Add(&knftables.Table{})
	tx.Add(&knftables.Chain{Name: "prerouting", Type: knftables.PtrTo(knftables.NATType),
		Hook: knftables.PtrTo(knftables.PreroutingHook), Priority: knftables.PtrTo(knftables.BaseChainPriority("-100"))})
	tx.Add(&knftables.Rule{Chain: "prerouting",
		Rule: "ip daddr 172.30.0.10 tcp dport 80 dnat ip to numgen random mod 2 map { 0 : 10.0.1.5 . 8080, 1 : 10.0.1.6 . 8080 }"})
	if err := nft.Run(context.Background(), tx); err != nil {
		panic(err)
	}

	r, err := l.Client.Echo(lab.Request{Proto: lab.TCP, Dst: netip.MustParseAddrPort("172.30.0.10:80")})
	switch lab.Classify(err) {
	case lab.Answered:
		fmt.Println(r.Pod, "saw", r.Source) // e.g. "pod-b saw 192.168.10.2:41234"
	case lab.Refused, lab.TimedOut:
		fmt.Println("no answer:", err)
	}
}
