# nftproxy build, test and demo entry points. Every target installs what it needs
# on a fresh Debian machine.

GO        ?= go
GINKGO    ?= $(GO) tool ginkgo
PKGS      ?= ./...
TESTFLAGS ?=

.PHONY: all build test unit e2e demo bench lint tools deps

all: build

# deps installs the kernel tooling the tests and the daemon use (nft, ip, conntrack).
deps:
	@missing=""; \
	for c in nft:nftables ip:iproute2 conntrack:conntrack; do \
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

tools:
	$(GO) install github.com/onsi/ginkgo/v2/ginkgo

# test runs every suite. Suites that need root skip with a message when not root.
test: deps
	$(GO) test $(TESTFLAGS) -count=1 $(PKGS)

# e2e runs the real-kernel suites only (root; namespaces are created and removed).
e2e: deps
	$(GO) test -count=1 -v ./e2e/...

demo: deps
	$(GO) run ./tools/nftrace --cluster examples/cluster.yaml --print-ruleset

bench: deps
	$(GO) test -run '^$$' -bench . -benchtime 2s ./sim/ ./proxier/...

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
