# munchable-webhooks: every target runs from a clean clone with Go and the
# Postgres/Redis server binaries installed; nothing needs to be running.

GO      ?= go
BIN     := bin/munchable-webhooks
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# The Dockerfile builds with exactly these flags.
BUILD_FLAGS := -trimpath -ldflags "-s -w -X main.version=$(VERSION)"

.PHONY: build run test lint bench fuzz

build:
	CGO_ENABLED=0 $(GO) build $(BUILD_FLAGS) -o $(BIN) ./cmd/munchable-webhooks

# run serves with the configuration in the environment (see README.md).
run: build
	./$(BIN) serve

# test runs every test with the race detector. Without TEST_DATABASE_URL and
# TEST_REDIS_URL it starts throwaway postgres and redis-server first.
test:
	$(GO) run ./internal/dbtest/withservers -- $(GO) test -race -count=1 ./...

lint:
	$(GO) vet ./...
	@out="$$(gofmt -l .)"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) tool staticcheck ./...

# bench runs the Go benchmarks of the hot paths against throwaway servers.
bench:
	$(GO) run ./internal/dbtest/withservers -- $(GO) test -run '^$$' -bench . -benchmem ./...

# fuzz runs every fuzz target for FUZZTIME each (CI: a few seconds; seed
# corpora live in each package's testdata/fuzz). Longer: make fuzz FUZZTIME=10m
FUZZTIME ?= 30s
FUZZ_TARGETS := ./internal/claim:FuzzParseValue ./internal/stripehook:FuzzDecode \
	./internal/resendhook:FuzzEvent ./internal/resendhook:FuzzSignatureHeaders ./internal/support:FuzzForm
fuzz:
	@for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t##*:}; \
		echo "fuzz $$fn in $$pkg for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	done
