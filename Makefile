# dualflow Makefile. `make help` lists the targets.
#
# The two commands a new machine needs are `make run` and `make test`: both
# install what they need (scripts/deps.sh) and are quick when it is present.

SHELL        := /bin/bash
.SHELLFLAGS  := -eo pipefail -c
GO           ?= go
BIN          := bin/dualflow
VERSION      ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT       ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
LDFLAGS      := -X main.version=$(VERSION) -X main.commit=$(COMMIT)
CHDB_LIB     := $(CURDIR)/.cache/chdb/current/libchdb.so
DATA_DIR     ?= $(CURDIR)/var/data
# make run: where the demo's lab, store and listeners go. A second demo
# beside a first needs other values for all of them (make help shows an
# example); DEMO_FLAGS passes any other flag of `dualflow demo`. Set with
# := so that an unrelated PREFIX in the environment does not leak in.
STATE_DIR            := /run/dualflow/lab
PREFIX               := df-
WEB_ADDR             := 127.0.0.1:8080
CLICKHOUSE_HTTP_ADDR := 127.0.0.1:8123
METRICS_ADDR         := 127.0.0.1:9464
# Empty: TCP and UDP on 127.0.0.1 and [::1] port 4739.
IPFIX_ADDR           :=
DEMO_FLAGS           ?=
RUN_VARS             := STATE_DIR PREFIX DATA_DIR WEB_ADDR CLICKHOUSE_HTTP_ADDR METRICS_ADDR IPFIX_ADDR
# Go packages whose tests need root, network namespaces, browsers or the
# real kube-apiserver.
E2E_PKGS     := ./test/e2e/...
# Tests of the e2e tier run at once (go test -parallel; Go's default is
# GOMAXPROCS, 2 here): each test has its own labs, ports, directories and
# store database, and most of its time waits (flushes, idle timeouts, labs
# and daemons starting), so 4 at once fill 2 cores without starving the
# timing-sensitive ones, which stay serial and run first.
E2E_PARALLEL ?= 4
BENCH_TIME   ?= 1s
BENCH_PKGS   ?= ./...

export CHDB_LIB_PATH := $(CHDB_LIB)
export CGO_ENABLED   ?= 0

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@awk 'BEGIN{FS=":.*## "} /^[a-zA-Z_-]+:.*## /{printf "  \033[1m%-15s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@printf '\nmake run settings (make run NAME=value ...), now:\n'
	@$(foreach v,$(RUN_VARS) DEMO_FLAGS,printf '  %-21s %s\n' '$(v)' '$($(v))';)
	@printf 'A second demo beside a first needs other values for all of them, e.g.\n'
	@printf '  make run STATE_DIR=/run/dualflow/lab2 PREFIX=df2- DATA_DIR=var/data2 WEB_ADDR=127.0.0.1:8081 \\\n'
	@printf '    CLICKHOUSE_HTTP_ADDR=127.0.0.1:8124 METRICS_ADDR=127.0.0.1:9465 IPFIX_ADDR=127.0.0.1:4839\n'

.PHONY: deps
deps: ## install apt packages, the pinned libchdb and Go modules (idempotent)
	@scripts/deps.sh

.PHONY: build
# No -trimpath: it changes every package's build key, so on a cold cache
# the binary would compile the whole dependency graph again next to the
# test builds (about 3 minutes of a fresh make test on 2 cores).
# The first build compiles every dependency (minutes on 2 cores):
# scripts/build.sh says every 10 s how long and how many packages so far.
build: ## build bin/dualflow
	@GO='$(GO)' scripts/build.sh '$(BIN)' '$(LDFLAGS)'

.PHONY: image
image: deps ## build the OCI images dualflow and dualflow-chdb FROM scratch (scripts/image.sh)
	VERSION=$(VERSION) COMMIT=$(COMMIT) scripts/image.sh

.PHONY: run
# The check comes first: a demo already running with the same lab, data
# directory or ports is reported in a second, not after deps and build.
run: ## start the product on the embedded ClickHouse and print the URLs (settings: make help)
	@$(foreach v,$(RUN_VARS),$(v)='$($(v))') scripts/run-check.sh
	@$(MAKE) --no-print-directory deps build
	$(BIN) demo --data-dir '$(DATA_DIR)' --state-dir '$(STATE_DIR)' --prefix '$(PREFIX)' --web.addr '$(WEB_ADDR)' \
	  --clickhouse.http-addr '$(CLICKHOUSE_HTTP_ADDR)' --metrics-addr '$(METRICS_ADDR)' \
	  $(if $(IPFIX_ADDR),--collector.ipfix.tcp-addr '$(IPFIX_ADDR)' --collector.ipfix.udp-addr '$(IPFIX_ADDR)') $(DEMO_FLAGS)

.PHONY: vet
vet: ## go vet and gofmt check
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# make test builds the pinned kube-apiserver (first time: minutes, then
# cached in .cache/kube-apiserver), the deployment tier's kubectl and helm
# CLIs (.cache/k8s, .cache/helm) and its renderer
# (test/deploy/render: its modules and Go build cache) in the background while the dependencies
# install and vet and the unit tier run, and waits for it before the e2e
# tier. The build needs only Go, which is on the machine from the start;
# it runs at nice 10 so that the timing-sensitive tests get the CPU first.
# The real cluster's binaries build after it (nice 15), and its tier runs
# beside the e2e tier, from when they are built: it spends most of its
# time waiting for kubelets, pods and traffic, so the two together take
# little longer than the e2e tier alone (its output goes to
# var/test-cluster.log and is printed once both end). Both run to their
# end even when the other failed, and the times per tier close the output.
.PHONY: test
test: ## install what tests need and run every test tier
	@mkdir -p var; \
	setsid nice -n 10 sh -c 'scripts/kube-apiserver.sh && scripts/k8s-cluster.sh kubectl && scripts/helm.sh && echo "[deploy-render] building test/deploy/render (kustomize, Helm; first time: minutes)" && cd test/deploy/render && $(GO) build -mod=readonly -o /dev/null .' >var/kube-apiserver.log 2>&1 & kpid=$$!; \
	trap 'kill -- -$$kpid 2>/dev/null' INT TERM; \
	setsid nice -n 15 sh -c 'while kill -0 '$$kpid' 2>/dev/null; do sleep 5; done; scripts/k8s-cluster.sh' >var/k8s-cluster.log 2>&1 & cpid=$$!; \
	trap 'kill -- -$$kpid -$$cpid 2>/dev/null' INT TERM; \
	t0=$$SECONDS; status=0; $(MAKE) --no-print-directory deps vet test-unit || status=$$?; times=" deps+vet+unit=$$((SECONDS-t0))s"; \
	if [ $$status != 0 ]; then kill -- -$$kpid -$$cpid 2>/dev/null; wait $$kpid $$cpid; exit $$status; fi; \
	echo "waiting for the kube-apiserver build (var/kube-apiserver.log)"; \
	if ! wait $$kpid; then cat var/kube-apiserver.log; echo "kube-apiserver build failed"; kill -- -$$cpid 2>/dev/null; exit 1; fi; \
	cat var/kube-apiserver.log; \
	$(MAKE) --no-print-directory build; \
	( while kill -0 $$cpid 2>/dev/null; do sleep 5; done; \
	  if ! scripts/k8s-cluster.sh >>var/k8s-cluster.log 2>&1; then cat var/k8s-cluster.log; echo "the real cluster's build failed"; exit 1; fi; \
	  t0=$$SECONDS; s=0; $(MAKE) --no-print-directory test-cluster-run || s=$$?; echo "[test-cluster] $$((SECONDS-t0))s"; exit $$s ) >var/test-cluster.log 2>&1 & tpid=$$!; \
	t0=$$SECONDS; status=0; $(MAKE) --no-print-directory test-e2e || status=$$?; times="$$times e2e=$$((SECONDS-t0))s"; \
	echo "waiting for the real-cluster tier (var/test-cluster.log)"; \
	cstatus=0; wait $$tpid || cstatus=$$?; cat var/test-cluster.log; \
	times="$$times cluster=$$(sed -n 's/^\[test-cluster\] //p' var/test-cluster.log) (e2e and cluster together: $$((SECONDS-t0))s)"; \
	echo "make test: time per tier:$$times"; \
	if [ $$status != 0 ]; then exit $$status; fi; \
	if [ $$cstatus != 0 ]; then exit $$cstatus; fi
	@echo "make test: all tiers passed"

# The fast tier, for the edit-test loop: no root, no engine, no browser.
# Tests that need the engine skip (the library path points nowhere), and
# -short skips the slow ones.
.PHONY: check
check: ## the fast tier: go vet, gofmt and the unit tests that need neither root nor the engine
	@$(MAKE) --no-print-directory vet
	CHDB_LIB_PATH=/nonexistent/libchdb.so $(GO) test -short -count=1 $$($(GO) list ./... | grep -v /test/e2e)

# The real-cluster tier (test/cluster): a two-node Kubernetes cluster of
# kubelet, containerd, the CNI bridge and kube-proxy (nftables) in network
# namespaces, dualflow installed on it as docs/deploy.md says, in three IP
# modes. make test builds its binaries in the background (first time:
# 15-25 minutes; cached in .cache) and runs it beside the e2e tier.
.PHONY: test-cluster
test-cluster: build test-cluster-run ## the real-cluster tier alone (root): dualflow on kubelet, containerd, CNI and kube-proxy, three IP modes

# test-cluster-run: the tier without building bin/dualflow first (make
# test builds it once, before the e2e and cluster tiers start side by side).
.PHONY: test-cluster-run
test-cluster-run:
	@if [ "$$(id -u)" != 0 ]; then echo "test-cluster needs root (network namespaces, containerd)"; exit 1; fi
	DUALFLOW_E2E=1 $(GO) test -count=1 -timeout 45m -v ./test/cluster/ 2>&1 | scripts/e2e-summary.sh

# make cluster: a second way to try dualflow, next to make run's lab.
.PHONY: cluster
cluster: deps ## a real two-node Kubernetes cluster on this machine, until Ctrl-C (first time: 15-25 minutes of builds)
	$(GO) run ./test/cluster/cmd/cluster up --mode $${MODE:-dual}

.PHONY: cluster-down
cluster-down: ## remove what a crashed make cluster left
	$(GO) run ./test/cluster/cmd/cluster down

.PHONY: kube-apiserver
kube-apiserver: ## build the pinned kube-apiserver of the real-API-server tests (cached)
	@scripts/kube-apiserver.sh

.PHONY: test-unit
test-unit: ## unit and integration tests (real chDB engine, fake Kubernetes)
	DUALFLOW_REQUIRE_CHDB=1 $(GO) test -count=1 -timeout 15m $$($(GO) list ./... | grep -v /test/e2e)

.PHONY: test-e2e
test-e2e: build kube-apiserver ## end-to-end tests in network-namespace labs (root), three IP modes
	@if [ "$$(id -u)" != 0 ]; then echo "test-e2e needs root (network namespaces)"; exit 1; fi
	DUALFLOW_E2E=1 DUALFLOW_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -timeout 45m -parallel $(E2E_PARALLEL) -v $(E2E_PKGS) 2>&1 | scripts/e2e-summary.sh

# The deployment tier runs within test-e2e; this target runs it alone:
# deploy/kubernetes and deploy/helm rendered in-process and checked, then
# installed with the real kubectl and helm (pinned builds, cached in
# .cache) into the real kube-apiserver as docs/deploy.md says, moved from
# one tool to the other, and the deployed RBAC proven (docs/deploy.md).
.PHONY: deploy-check
deploy-check: kube-apiserver ## install the Kubernetes manifests and Helm chart with kubectl and helm (real API server)
	@scripts/k8s-cluster.sh kubectl >/dev/null && scripts/helm.sh >/dev/null
	DUALFLOW_E2E=1 $(GO) test -count=1 -v -run 'TestDeploy' ./test/e2e/

# The security tier runs within test-unit and test-e2e; this target runs it
# alone: the attacks of docs/security.md against the real engine and
# listeners (unit), the collector binary (e2e TestSecurity) and the kill -9
# test (TestCrashLosesNothing), in three IP modes.
SECURITY_UNIT = 'TestAuth|TestAnonymous|TestSlowSenders|TestReadonly|TestRejectsCrossSite|TestIdleSockets|TestIdleTimeout|TestIdleSessions|TestTemplateBudget|TestAllowedSources|TestCrashReplays|TestHTTPInterfaceAuth|TestDataDirPrivate|Refuse|Outfile|TestBearer|TestLoadTokens|TestTokensFileMode|TestSQLConcurrency|TestFollowStream|TestFilterTooLarge|TestHostCheck|Rebind|TestCorpus|TestRefusalReasons|TestVetStatement|TestGrammarSeeds|FuzzGrammar|TestEngineConfined|TestThrowawayEngine|TestNoSQLWritesAFile|TestInserter|TestReaderCannotLiftLimits|TestSystemProcessesHidden|TestSlowClients|TestEngineSlotsPerUser|TestSlowBodiesPerUser|TestSQLCredentials|TestSQLReadsUnlessWrite|TestLocalRequestsAreViewers|TestHeaderOnlySessions|TestReservedSessions|TestConnSet|TestWhatIfGate|TestReachabilityGate|TestReachabilityWorkBound|TestWhatIfWorkBound|TestHandlerBearerScheme|TestHandlerRefusesProbes|TestHandlerRateLimits|TestLoadTokenFileMode|TestController(ProbeShape|ExternalDestinations|RateLimits|KeepPerCaller)|TestWatchesQueue|TestTableRemovedAfter|TestSweep|TestTLSRotation|TestTLSVerify|TestTLSReload|TestDirectoryTLSReload|TestServerTLSReload|TestServerTLSName|TestTokensReload|TestTokensFileReload'
.PHONY: test-security
test-security: build ## the security tier alone (attacks, crash test), three IP modes
	DUALFLOW_REQUIRE_CHDB=1 $(GO) test -count=1 -run $(SECURITY_UNIT) ./collector/... ./web/... ./netaddr/... ./cmd/... ./traceflow/... ./internal/... ./exporter/...
	DUALFLOW_E2E=1 DUALFLOW_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -v -run 'TestSecurity|TestCrashLosesNothing' ./test/e2e/ 2>&1 | scripts/e2e-summary.sh

# -p 1: one package's benchmarks at a time (by default go test runs the test
# binaries of several packages at once, and the engine benchmarks of two
# packages then share the 2 cores and measure each other). The table ends
# with the writer's and the pipeline's shares of the engine's ceiling.
.PHONY: bench
bench: deps ## run every Go benchmark and print a table
	@mkdir -p var
	DUALFLOW_REQUIRE_CHDB=1 $(GO) test -p 1 -run '^$$' -bench . -benchmem -benchtime $(BENCH_TIME) -timeout 60m $(BENCH_PKGS) 2>&1 | tee var/bench.txt | $(GO) run ./test/benchtable

# The issue's targets only: the writer and the engine ceiling over the same
# 5M rows (alternated), then the enriched pipeline over 5M records and the
# engine ceiling over the same enriched rows (alternated), in one go test
# run; the table ends with the shares of the ceiling (targets: the writer
# >= 85%, the enriched pipeline >= 70%).
.PHONY: bench-ceiling
bench-ceiling: deps ## the writer and the enriched pipeline as shares of the engine's ceiling (5M rows)
	@mkdir -p var
	DUALFLOW_REQUIRE_CHDB=1 $(GO) test -p 1 -run '^$$' -bench 'WriterEmbedded5M|EndToEnd/^(pods=2000|enriched)$$' -benchmem -benchtime 1x -timeout 60m ./collector/store/ ./collector/ 2>&1 | tee var/bench-ceiling.txt | $(GO) run ./test/benchtable

.PHONY: fuzz
fuzz: ## run each fuzz target for FUZZ_TIME (default 20s)
	@scripts/fuzz.sh $${FUZZ_TIME:-20s}

.PHONY: clean
clean: ## remove build outputs and local data (keeps the libchdb cache)
	rm -rf bin var test/artifacts

.PHONY: ui-vendor
ui-vendor: ## re-fetch the UI's pinned npm packages and verify their sha256 (UPDATE=1 rewrites them)
	@web/ui/vendor.sh $(if $(UPDATE),update,verify)

# Not part of make test or make bench: loads a generated data set (10M and
# 100M rows, several minutes each the first time, reused afterwards from
# var/scale) through the real store writer and times each REST endpoint
# and UI page's queries through the API and directly on the engine
# (docs/scale.md). SCALE_FLAGS passes flags, e.g. SCALE_FLAGS='-sizes 10M -iters 10'.
.PHONY: bench-query
bench-query: deps ## load (once) and benchmark the API's queries at 10M and 100M rows (docs/scale.md)
	@mkdir -p var/scale
	$(GO) run ./test/scale $(SCALE_FLAGS)
