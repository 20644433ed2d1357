# munchable-webhooks: every target runs from a clean clone with Go; dev,
# test and lint first run scripts/ensure-deps for what each needs beyond Go
# (dev: Postgres, Redis and psql; test adds a C compiler, chromium and
# promtool; lint needs promtool and shellcheck), installed with apt as root,
# or it says what to run. Nothing needs to be running.

GO      ?= go
BIN     := bin/munchable-webhooks
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# The commit `version` prints; go build reads it from the checkout too, but
# the image's build has no .git, so both pass it alike. "-dirty" when the
# tracked files differ from it, as VERSION's git describe --dirty says.
COMMIT  ?= $(shell c=$$(git rev-parse HEAD 2>/dev/null) && { git diff --quiet HEAD -- 2>/dev/null && echo $$c || echo $$c-dirty; })
# The Dockerfile builds with exactly these flags.
BUILD_FLAGS := -trimpath -ldflags "-s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)"

.PHONY: build run deps deps-dev deps-test deps-lint test lint bench bench-app-webhook bench-scale fuzz

# deps installs what dev, test and lint need beyond Go, or says how;
# deps-dev, deps-test and deps-lint only what that one target needs.
deps:
	@scripts/ensure-deps
deps-dev deps-test deps-lint:
	@scripts/ensure-deps $(@:deps-%=%)

# The first build downloads the modules and compiles them all: say so, as
# it is the one long step with no output of its own.
build:
	@[ -x $(BIN) ] || echo "building $(BIN) (the first build downloads the modules and compiles them: minutes, 7 on a busy 2-core machine; later builds take seconds)"
	CGO_ENABLED=0 $(GO) build $(BUILD_FLAGS) -o $(BIN) ./cmd/munchable-webhooks

# run serves with the configuration in the environment (see README.md).
run: build
	./$(BIN) serve

# test runs every test with the race detector. Without TEST_DATABASE_URL and
# TEST_REDIS_URL it starts throwaway postgres and redis-server first. It
# builds the binary first: the README's quick start test runs make dev, and
# on a cold cache that build would otherwise eat into the test's timeout.
# Then the packages that write to Postgres run again in each pgx query mode
# a transaction pooler needs (TEST_PGX_QUERY_MODE, read by internal/dbtest);
# the default mode ran above. Those reruns skip -race: the mode changes
# what goes over the wire, not what runs concurrently.
STORE_PKGS := ./internal/entitlements ./internal/stripehook ./internal/support ./internal/resendhook ./internal/relay ./internal/leader
QUERY_MODES := exec simple_protocol
test: deps-test build
	$(GO) run ./tools/withservers -- sh -c '$(GO) test -race -count=1 ./... && \
		for mode in $(QUERY_MODES); do \
			echo "pgx query mode $$mode:"; \
			TEST_PGX_QUERY_MODE=$$mode $(GO) test -count=1 $(STORE_PKGS) || exit 1; \
		done'

# lint also checks the alerting rules and runs their unit tests, checks the
# GitHub Actions workflows with actionlint (pinned as a tool in a module file
# of its own, tools/lint/actionlint.mod, as its YAML library clashes with
# compose-go's in go.mod; it runs shellcheck on their run steps), lints every
# migration with squawk (scripts/lint-migrations; the rules it breaks on
# purpose are listed, with why, in migrations/squawk.toml), and checks every shell
# script git tracks with shellcheck. A script is found by its first line, a
# sh or bash shebang, so a new one is checked without being listed here.
SHELL_SCRIPTS = $(shell git ls-files -z | xargs -0 awk 'FNR == 1 { if (/^\#!.*[\/ ](ba|da)?sh( |$$)/) print FILENAME; nextfile }')
lint: deps-lint
	$(GO) vet ./...
	@out="$$(gofmt -l .)"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) tool staticcheck ./...
	$(GO) tool -modfile=tools/lint/actionlint.mod actionlint
	promtool check rules deploy/prometheus/alerts.yaml
	promtool test rules deploy/prometheus/alerts_test.yaml
	scripts/lint-migrations
	shellcheck $(SHELL_SCRIPTS)

# bench runs the load harness (tools/bench) against throwaway Postgres and
# Redis: the service binary beside its ceilings (chi, the service's intake,
# pgbench on its upsert), in about three minutes. It writes the tables to
# BENCH_OUT (docs/PERFORMANCE.md explains them), then appends the Go
# benchmarks of the packages a delivery crosses. `go run ./tools/bench -h`
# lists the knobs BENCH_FLAGS may set.
BENCH_OUT ?= docs/bench-latest.md
BENCH_PKGS := ./internal/stripehook ./internal/claim ./internal/entitlements
bench:
	$(GO) run ./tools/bench -go $(GO) -out $(BENCH_OUT) $(BENCH_FLAGS)
	printf '## Go benchmarks\n\n```\n' >> $(BENCH_OUT)
	$(GO) run ./tools/withservers -- $(GO) test -run '^$$' -bench . -benchmem -benchtime 500ms $(BENCH_PKGS) >> $(BENCH_OUT)
	printf '```\n' >> $(BENCH_OUT)

# bench-app-webhook compares first deliveries with the app's webhook on
# (every change sent to examples/appreceiver, which stands in for the app's
# machine) and with the relay off, in alternating rounds, and takes the
# relay's own cost per webhook, measured as it catches up after each run,
# off the deliveries' (docs/PERFORMANCE.md, "The relay: the app's webhook
# beside first deliveries"); then the relay's Go benchmark. About four
# minutes. APP_WEBHOOK_RATE is the fixed rate of the second half.
APP_WEBHOOK_OUT ?= docs/bench-app-webhook-latest.md
APP_WEBHOOK_RATE ?= 1000
bench-app-webhook:
	$(GO) run ./tools/bench -go $(GO) -app-webhook -duration 20s -rounds 4 -rate $(APP_WEBHOOK_RATE) -out $(APP_WEBHOOK_OUT) $(BENCH_FLAGS)
	printf '## Go benchmark: the relay alone\n\n```\n' >> $(APP_WEBHOOK_OUT)
	$(GO) run ./tools/withservers -- $(GO) test -run '^$$' -bench RelayAppWebhook -benchmem -benchtime 20000x ./internal/relay >> $(APP_WEBHOOK_OUT)
	printf '```\n' >> $(APP_WEBHOOK_OUT)

# bench-scale grows the tables to SCALE subscriptions (with their sessions,
# ledger rows and changes; default a million) and measures deliveries, the
# access lookups, feed pages and a retention pass over 0.9 SCALE expired
# rows on an empty database, at SCALE/10 and at SCALE, side by side
# (docs/PERFORMANCE.md, "How cost grows"). Postgres durable, as production
# runs it. About 25 minutes at a million on a 2-core machine; needs a few
# GB of disk under $$TMPDIR.
SCALE ?= 1000000
SCALE_OUT ?= docs/bench-scale-latest.md
bench-scale:
	$(GO) run ./tools/bench -go $(GO) -scale $(SCALE) -durable -concurrency 16 -rate 300 -duration 10s -out $(SCALE_OUT) $(BENCH_FLAGS)

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

# dev runs the service on 127.0.0.1:8080 with the dev-only secrets of
# docker-compose.yml (each overridable from the environment; DEV_MODE=true,
# without which serve refuses them) against throwaway postgres and
# redis-server kept under DEV_DIR (./.dev/), or against the servers named by
# DATABASE_URL and REDIS_URL, and against dev-only stand-ins for the Resend
# API (tools/devresend, serving testdata/devresend; unless RESEND_API_URL is
# set) and the Stripe API (tools/devstripe, holding Stripe's side of
# testdata/events; unless STRIPE_API_KEY is set). It prints the URLs and
# writes to DEV_DIR/env everything a second shell needs (`set -a; . .dev/env;
# set +a`, for send, claims, events, stripe and psql): both servers' URLs,
# the variables -export names, and each stand-in's URL (and the Stripe
# stand-in's key). serve migrates first. Ctrl-C drains the service, then
# stops the stand-ins and the servers. (withservers is built, not `go run`:
# go run exits 1 after any Ctrl-C, which would hide the service's status.)
# Support messages are forwarded to team@munchable.app (SUPPORT_FORWARD_TO=
# turns it off): the Resend stand-in prints each forward it would have sent.
# RESEND_DOWNLOAD_ALLOW_PRIVATE lets the service download attachments from
# the stand-in, on loopback over http. The tools build with the binary's
# CGO_ENABLED and -trimpath, so that they reuse what its build compiled: on
# a cold cache, a default build of withservers took four more minutes.
DEV_DIR ?= .dev
# The app's webhook is off unless APP_WEBHOOK_URL and APP_WEBHOOK_SECRET are
# set (the README's local receiver); when set, they go to DEV_DIR/env too,
# for `relay retry app_webhook`, which rebuilds the destination, and
# APP_API_TOKEN for calls to GET /v1/access.
DEV_EXPORTS := LISTEN_ADDR STRIPE_WEBHOOK_SECRET RESEND_WEBHOOK_SECRET RESEND_API_KEY \
	RESEND_DOWNLOAD_ALLOW_PRIVATE SUPPORT_INBOUND_ADDRESSES SUPPORT_FORWARD_TO SUPPORT_FORWARD_FROM DEV_MODE \
	APP_WEBHOOK_URL APP_WEBHOOK_SECRET APP_WEBHOOK_ALLOW_HTTP APP_WEBHOOK_KINDS APP_API_TOKEN
.PHONY: dev
# The sweeps and the scheduled verify are off unless SWEEP_INTERVAL or
# VERIFY_INTERVAL is set: the quick start's sends must be the first
# deliveries, and its stripe verify the one to find the drift.
# SWEEP_INTERVAL=30s make dev runs both sweeps against the stand-ins: the
# Stripe sweep delivers the stand-in's lost event; the Resend one lists
# received mail, and a first pass reaches back one interval and 10 minutes,
# so it passes over the sample mail (created 2026-02-22).
dev: deps-dev build
	CGO_ENABLED=0 $(GO) build -trimpath -o bin/withservers ./tools/withservers
	CGO_ENABLED=0 $(GO) build -trimpath -o bin/devresend ./tools/devresend
	CGO_ENABLED=0 $(GO) build -trimpath -o bin/devstripe ./tools/devstripe
	LISTEN_ADDR="$${LISTEN_ADDR:-127.0.0.1:8080}" \
	DEV_MODE=true \
	STRIPE_WEBHOOK_SECRET="$${STRIPE_WEBHOOK_SECRET:-whsec_dev_only_stripe}" \
	RESEND_WEBHOOK_SECRET="$${RESEND_WEBHOOK_SECRET:-whsec_ZGV2LW9ubHktcmVzZW5kLXNlY3JldA==}" \
	RESEND_API_KEY="$${RESEND_API_KEY:-re_dev_only}" \
	RESEND_DOWNLOAD_ALLOW_PRIVATE="$${RESEND_DOWNLOAD_ALLOW_PRIVATE:-true}" \
	SUPPORT_INBOUND_ADDRESSES="$${SUPPORT_INBOUND_ADDRESSES:-support@munchable.app}" \
	SUPPORT_FORWARD_TO="$${SUPPORT_FORWARD_TO-team@munchable.app}" \
	SUPPORT_FORWARD_FROM="$${SUPPORT_FORWARD_FROM:-Munchable Support <support-forward@munchable.app>}" \
	DEV_MODE="$${DEV_MODE:-true}" \
	LOG_LEVEL="$${LOG_LEVEL:-debug}" \
	SWEEP_INTERVAL="$${SWEEP_INTERVAL:-0}" \
	VERIFY_INTERVAL="$${VERIFY_INTERVAL:-0}" \
	bin/withservers -dir $(DEV_DIR) -env-file $(DEV_DIR)/env -database-env DATABASE_URL -redis-env REDIS_URL \
		$(DEV_EXPORTS:%=-export %) -- \
		bin/devresend -data testdata/devresend -env-file $(DEV_DIR)/env -- \
		bin/devstripe -events testdata/events -env-file $(DEV_DIR)/env -- ./$(BIN) serve

# soak plays Stripe and Resend (20,000 events by default, 30 % redelivered,
# some out of order) against the service while Redis, Postgres and the
# service are killed and restarted at random, then checks the database
# against a model. Needs only the server binaries; SOAK_FLAGS=-h lists flags.
.PHONY: soak
soak:
	$(GO) run ./tools/soak $(SOAK_FLAGS)
