package syncer

import (
	"context"
	"errors"
	"syscall"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/nftdata"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// TestKernelNetlinkSocket checks the life of a KernelNetlink transport's socket:
// batches share one socket, a refused batch closes it (the kernel may still owe
// answers on it), and the next batch opens another and is applied whole.
func TestKernelNetlinkSocket(t *testing.T) {
	ctx := context.Background()
	rs := ruleset.Build(cluster(10), testConfig, knftables.IPv4Family)
	ns, nft, s := netlinkSyncer(t, "nlsock", knftables.IPv4Family)
	if _, err := s.Sync(ctx, rs); err != nil {
		t.Fatal(err)
	}
	tr := KernelNetlink(ns.Do)
	sock := tr.(*kernelTransport).sock
	conts := netlinkContainers(rs)
	// The same table without the elements netlink carries.
	empty := ruleset.Build(cluster(10), testConfig, knftables.IPv4Family)
	for _, c := range conts {
		empty.Elements[c.name] = map[string]ruleset.Elem{}
	}
	if err := writeElements(ctx, empty, fullOps(empty, conts), tr, nil); err != nil {
		t.Fatal(err)
	}
	first := *sock.fd
	if first < 0 {
		t.Fatal("no socket open after a batch")
	}
	checkKernelTable(t, nft, empty, nil)
	if err := writeElements(ctx, rs, fullOps(rs, conts), tr, nil); err != nil {
		t.Fatal(err)
	}
	if *sock.fd != first {
		t.Errorf("second batch on socket %d; want the first's, %d", *sock.fd, first)
	}
	checkKernelTable(t, nft, rs, nil)

	// A batch the kernel refuses in its first message: the answers to the others
	// would be left on the socket.
	ghost := &container{name: "no-such-set"}
	ghost.key, _ = nftdata.ParseLayout("ipv4_addr")
	bad := ruleset.Build(cluster(10), testConfig, knftables.IPv4Family)
	bad.Elements[ghost.name] = map[string]ruleset.Elem{"10.0.0.1": {}}
	if err := writeElements(ctx, bad, fullOps(bad, append([]*container{ghost}, conts...)), tr, nil); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("error %v; want ENOENT", err)
	}
	if *sock.fd >= 0 {
		t.Errorf("socket %d still open after a refused batch", *sock.fd)
	}
	if err := writeElements(ctx, rs, fullOps(rs, conts), tr, nil); err != nil {
		t.Fatalf("batch after a refused one: %v", err)
	}
	checkKernelTable(t, nft, rs, nil)
	if err := s.Close(); err != nil {
		t.Errorf("closing the Syncer: %v", err)
	}
	if err := tr.(*kernelTransport).Close(); err != nil || *sock.fd >= 0 {
		t.Errorf("Close: %v, socket %d; want closed", err, *sock.fd)
	}
}
