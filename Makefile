# nftproxy build, test and demo entry points. Every target installs what it needs
# on a fresh Debian machine.

GO        ?= go
GINKGO    ?= $(GO) tool ginkgo
PKGS      ?= ./...
TESTFLAGS ?=

.PHONY: all build test unit e2e demo bench lint tools deps

all: build

# deps installs the kernel tooling the tests, the daemon and the bench use (nft, ip,
# conntrack, iptables for the bench's kube-proxy baseline).
deps:
	@missing=""; \
	for c in nft:nftables ip:iproute2 conntrack:conntrack iptables-legacy-restore:iptables; do \
		command -v $${c%%:*} >/dev/null 2>&1 || missing="$$missing $${c##*:}"; \
	done; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "installing$$missing"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
		else \
			echo "note: missing$$missing (kernel suites will skip)"; \
		fi; \
	fi

build:
	$(GO) build ./...
	$(GO) build -o bin/ ./tools/... ./cmd/... 2>/dev/null || $(GO) build -o bin/ ./tools/...
	$(GO) build -o bin/kubectl-nftrace ./tools/nftrace

tools:
	$(GO) install github.com/onsi/ginkgo/v2/ginkgo

# test runs every suite. Suites that need root skip with a message when not root.
test: deps
	$(GO) test $(TESTFLAGS) -count=1 $(PKGS)

# e2e runs the real-kernel suites only (root; namespaces are created and removed).
e2e: deps
	$(GO) test -count=1 -v ./e2e/...

# The example cluster's pod and Service CIDRs (examples/cluster.yaml): nftrace assumes
# none, and warns when they are missing.
EXAMPLE_CIDRS = --cluster-cidr 10.0.0.0/8,fd00::/28 --service-cidr 172.30.0.0/16,fd00:30::/108
NFTRACE = $(GO) run ./tools/nftrace --cluster examples/cluster.yaml $(EXAMPLE_CIDRS)

# demo prints the ruleset built for the example cluster, then traces a handful of
# packets through it.
demo:
	$(NFTRACE) --print-ruleset
	@echo; echo "### a pod connects to web's ClusterIP: DNAT to one of two endpoints"
	$(NFTRACE) 'tcp 10.1.0.20:40000 -> 172.30.0.10:80 iif veth1'
	@echo; echo "### the same ClusterIP on a port web does not have: REJECT"
	$(NFTRACE) 'tcp 10.1.0.20:40001 -> 172.30.0.10:81 iif veth1'
	@echo; echo "### an outside client on api's NodePort: masqueraded"
	$(NFTRACE) 'tcp 203.0.113.9:40002 -> 192.168.0.10:30080 iif eth0'
	@echo; echo "### ingress (externalTrafficPolicy Local) from an allowed source: local endpoint, source kept"
	$(NFTRACE) 'tcp 203.0.113.9:40003 -> 192.0.2.100:443 iif eth0'
	@echo; echo "### ingress from a source outside loadBalancerSourceRanges: DROP"
	$(NFTRACE) 'tcp 100.64.0.1:40004 -> 192.0.2.100:443 iif eth0'
	@echo; echo "### a Service without endpoints: REJECT"
	$(NFTRACE) 'tcp 10.1.0.20:40005 -> 172.30.0.15:80 iif veth1'

# bench measures nftproxy at scale against kube-proxy's iptables mode in the same run
# (root; every measurement runs in network namespaces it creates and removes), and
# writes bench-results/results.{json,md} and plot.png. BENCHFLAGS=--quick runs N <= 10k
# in about 2 minutes; `go run ./tools/bench --help` lists the flags.
BENCHFLAGS ?=
bench: deps
	$(GO) run ./tools/bench $(BENCHFLAGS)

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

# apiserver builds a real kube-apiserver (k8s.io/kubernetes v1.37.2, matching client-go
# v0.37.2) and etcd into .cache/apiserver/ (gitignored); the first build takes ~15 minutes.
# It also builds kube-controller-manager, kube-proxy and kubectl of the same release, for
# the cluster lab (under 3 minutes more with a warm Go build cache).
# test-apiserver runs the e2e/apiserver suite against them (root; it skips otherwise).
APISERVER_DIR ?= $(CURDIR)/.cache/apiserver

.PHONY: apiserver test-apiserver

apiserver:
	GO=$(GO) bash e2e/apiserver/build.sh $(APISERVER_DIR)

test-apiserver: deps apiserver
	NFTPROXY_APISERVER_DIR=$(APISERVER_DIR) $(GO) test -count=1 -v -timeout 30m ./e2e/apiserver/ -args -ginkgo.v -ginkgo.label-filter=apiserver

# cluster brings the cluster lab up for a person (root): the real etcd, kube-apiserver and
# kube-controller-manager (built by `make apiserver`), three nodes running nftproxy or the
# real kube-proxy (CLUSTERFLAGS=--nodes=node-a=nftproxy,node-b=kube-proxy-nftables,...) and a
# demo Service; it prints the kubeconfig and how to enter a node and trace a packet there,
# stays until Ctrl-C and removes every namespace it made. test-cluster runs e2e/cluster.
CLUSTERFLAGS ?=

.PHONY: cluster test-cluster

cluster: deps apiserver
	$(GO) build -o bin/labcluster ./e2e/cluster/labcluster
	NFTPROXY_APISERVER_DIR=$(APISERVER_DIR) ./bin/labcluster --repo=$(CURDIR) $(CLUSTERFLAGS)

test-cluster: deps apiserver
	NFTPROXY_APISERVER_DIR=$(APISERVER_DIR) $(GO) test -count=1 -v -timeout 15m ./e2e/cluster/...
