package lab_test

import (
	"net/netip"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/nftproxy/nftproxy/e2e/lab"
)

func TestLab(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "e2e/lab suite")
}

// labIDs are the labs this suite built, so that the final leak check ignores namespaces of
// other processes running the lab at the same time.
var (
	labIDsMu sync.Mutex
	labIDs   []string
)

func recordLab(id string) {
	labIDsMu.Lock()
	defer labIDsMu.Unlock()
	labIDs = append(labIDs, id)
}

var _ = BeforeSuite(func() {
	if err := lab.Usable(); err != nil {
		Skip(err.Error())
	}
	removed, err := lab.RemoveStale(30 * time.Minute)
	Expect(err).NotTo(HaveOccurred())
	if len(removed) > 0 {
		GinkgoWriter.Printf("removed stale lab namespaces: %v\n", removed)
	}
})

var _ = AfterSuite(func() {
	if lab.Usable() != nil {
		return
	}
	labIDsMu.Lock()
	defer labIDsMu.Unlock()
	Expect(lab.LeaksOf(labIDs)).To(BeEmpty(), "lab namespaces left behind by this suite")
})

// Addresses of the test topology, all private to the lab's namespaces.
var (
	nodeV4   = netip.MustParsePrefix("192.168.10.1/24")
	nodeV6   = netip.MustParsePrefix("fd00:10::1/64")
	clientV4 = netip.MustParsePrefix("192.168.10.2/24")
	clientV6 = netip.MustParsePrefix("fd00:10::2/64")
	link1V4  = netip.MustParsePrefix("192.168.20.1/24")
	link1V6  = netip.MustParsePrefix("fd00:20::1/64")
	remoteV4 = netip.MustParsePrefix("192.168.20.2/24")
	remoteV6 = netip.MustParsePrefix("fd00:20::2/64")
)

// dualStack is a node with two pods, a remote node with one pod and an external client.
func dualStack() lab.Spec {
	return lab.Spec{
		NodeAddrs: []netip.Prefix{nodeV4, nodeV6},
		Pods: []lab.PodSpec{
			{Name: "pod-a", Addrs: addrs("10.0.1.5", "fd00:1::5")},
			{Name: "pod-b", Addrs: addrs("10.0.1.6", "fd00:1::6")},
		},
		Remote: &lab.RemoteSpec{
			NodeAddrs: []netip.Prefix{link1V4, link1V6},
			Addrs:     []netip.Prefix{remoteV4, remoteV6},
			PodCIDRs:  []netip.Prefix{netip.MustParsePrefix("10.0.2.0/24"), netip.MustParsePrefix("fd00:2::/64")},
			Pods:      []lab.PodSpec{{Name: "pod-r", Addrs: addrs("10.0.2.5", "fd00:2::5")}},
		},
		Client: &lab.ClientSpec{Addrs: []netip.Prefix{clientV4, clientV6}},
	}
}

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

// newLab builds spec for the current spec and removes it afterwards, checking that nothing
// was left behind.
func newLab(spec lab.Spec) *lab.Lab {
	GinkgoHelper()
	l, err := lab.New(spec)
	Expect(err).NotTo(HaveOccurred())
	recordLab(l.ID)
	DeferCleanup(func() {
		Expect(l.Close()).To(Succeed())
		Expect(l.Leaks()).To(BeEmpty(), "namespaces, threads or descriptors of lab %s", l.ID)
	})
	DeferCleanup(func(ctx SpecContext) { // runs first: cleanups run in reverse order
		if CurrentSpecReport().Failed() {
			AddReportEntry("lab "+l.ID, l.Dump(ctx))
		}
	})
	return l
}

func ap(addr netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(addr, port) }
