# munchable-webhooks: every target runs from a clean clone with Go and the
# Postgres/Redis server binaries installed; nothing needs to be running.

GO      ?= go
BIN     := bin/munchable-webhooks
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# The Dockerfile builds with exactly these flags.
BUILD_FLAGS := -trimpath -ldflags "-s -w -X main.version=$(VERSION)"

.PHONY: build run test test-short lint bench

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
