package metrics

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

func TestServeExposesEveryMetric(t *testing.T) {
	m := New()
	// Touch every vector so that its series exist.
	m.SyncDuration.WithLabelValues(SyncType(true)).Observe(0.5)
	m.SyncDuration.WithLabelValues(SyncType(false)).Observe(0.01)
	m.NetworkProgrammingDuration.Observe(1.5)
	m.LastSyncTimestamp.Set(1700000000)
	m.SyncFailures.WithLabelValues("ip").Inc()
	m.SyncOperations.WithLabelValues("ip6", SyncPartial).Observe(3)
	m.Services.WithLabelValues("ip").Set(4)
	m.Endpoints.WithLabelValues("ip").Set(5)
	m.TableObjects.WithLabelValues("ip").Set(6)
	m.ServicesWithoutLocalEndpoints.WithLabelValues(PolicyExternal).Set(7)
	m.InvalidObjects.WithLabelValues("Service").Set(8)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Serve(ctx, l) }()
	resp, err := http.Get("http://" + l.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve after shutdown: %v", err)
	}
	text := string(body)
	for _, want := range []string{
		`nftproxy_sync_proxy_rules_duration_seconds_count{type="full"} 1`,
		`nftproxy_sync_proxy_rules_duration_seconds_count{type="partial"} 1`,
		`nftproxy_network_programming_duration_seconds_bucket{le="2"} 1`,
		`nftproxy_network_programming_duration_seconds_bucket{le="1"} 0`,
		`nftproxy_sync_proxy_rules_last_timestamp_seconds 1.7e+09`,
		`nftproxy_sync_failures_total{family="ip"} 1`,
		`nftproxy_sync_operations_bucket{family="ip6",type="partial",le="4"} 1`,
		`nftproxy_services{family="ip"} 4`,
		`nftproxy_endpoints{family="ip"} 5`,
		`nftproxy_table_objects{family="ip"} 6`,
		`nftproxy_services_without_local_endpoints{traffic_policy="external"} 7`,
		`nftproxy_invalid_objects{kind="Service"} 8`,
		`process_start_time_seconds`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("scrape lacks %q", want)
		}
	}
}

func TestProgrammingBucketsAscend(t *testing.T) {
	b := programmingBuckets()
	for i := 1; i < len(b); i++ {
		if b[i] <= b[i-1] {
			t.Fatalf("bucket %d (%v) not above %v", i, b[i], b[i-1])
		}
	}
	if b[0] != 0.25 || b[len(b)-1] != 300 {
		t.Errorf("buckets span %v..%v, want 0.25..300", b[0], b[len(b)-1])
	}
}
