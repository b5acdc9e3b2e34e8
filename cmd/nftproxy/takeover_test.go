package main

import (
	"bytes"
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/knftables"
)

// TestCleanupTableAfterSync runs the daemon with --cleanup-table-after-sync=kube-proxy on
// a node holding kube-proxy's tables: they are deleted, in both families, and only once
// nftproxy's own table serves the Services.
func TestCleanupTableAfterSync(t *testing.T) {
	ours, theirs := &fakeTables{}, &fakeTables{}
	for _, fam := range []knftables.Family{knftables.IPv4Family, knftables.IPv6Family} {
		nft, _ := theirs.newNFT(fam, "kube-proxy")
		tx := nft.NewTransaction()
		tx.Add(&knftables.Table{})
		tx.Add(&knftables.Chain{Name: "services"})
		if err := nft.Run(context.Background(), tx); err != nil {
			t.Fatal(err)
		}
	}
	var early atomic.Bool // kube-proxy's table opened before ours served the Service
	newNFT := func(fam knftables.Family, table string) (knftables.Interface, error) {
		if table == "kube-proxy" {
			if !ours.hasServiceIP(knftables.IPv4Family, "172.30.0.10", "tcp", "80") {
				early.Store(true)
			}
			return theirs.newNFT(fam, table)
		}
		return ours.newNFT(fam, table)
	}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", ResourceVersion: "1"}}
	cs := fake.NewClientset(node, testService("web", "172.30.0.10"), testSlice("web", "10.1.0.5"))
	d := deps{newNFT: newNFT, newClient: func(*Options) (kubernetes.Interface, error) { return cs, nil }}
	args := []string{"--hostname-override=node-a", "--cluster-cidr=10.0.0.0/8", "--healthz-bind-address=",
		"--metrics-bind-address=", "--cleanup-table-after-sync=kube-proxy"}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr syncBuffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, args, &stderr, d) }()
	eventually(t, "kube-proxy's tables deleted", func() bool {
		return theirs.get(knftables.IPv4Family).Dump() == "" && theirs.get(knftables.IPv6Family).Dump() == ""
	})
	if early.Load() {
		t.Error("kube-proxy's tables were touched before nftproxy's served the Service")
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("daemon exited %d: %s", code, stderr.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("daemon did not stop after its context was cancelled")
	}
	if !strings.Contains(stderr.String(), "deleted the tables of --cleanup-table-after-sync") {
		t.Errorf("the log does not say the tables were deleted:\n%s", stderr.String())
	}
}

// TestCleanupTableAfterSyncNotOwnTable: the flag refuses nftproxy's own table.
func TestCleanupTableAfterSyncNotOwnTable(t *testing.T) {
	var stderr bytes.Buffer
	code := run(context.Background(), []string{"--hostname-override=n", "--cleanup-table-after-sync=nftproxy"}, &stderr, deps{})
	if code != 1 || !strings.Contains(stderr.String(), "--cleanup-table-after-sync") {
		t.Errorf("exit %d, stderr %q; want 1 and a message naming --cleanup-table-after-sync", code, stderr.String())
	}
}
