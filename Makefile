# The two commands the README names: `make demo` and `make test`.
# Both create (or reuse) .venv and install the project with what it needs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PACKAGES := logstore spark_source spark_sink compaction replication jobs

.PHONY: setup test lint demo bench bench-kafka bench-replication bench-compaction-cluster proto clean etcd chaos chaos-liveness chromium kafka-jars spark-packages screenshots fuzz

# pip's output (and setuptools' editable-install banner) goes to $(VENV)/install.log: a
# terminal sees one line, and the log's tail only if the install fails.
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing logstore and what it needs into $(VENV) (once; log: $(VENV)/install.log)" >&2
	@{ $(PY) -m pip install --quiet --upgrade pip && $(PY) -m pip install --quiet -e '.[spark,dev]'; } \
		> $(VENV)/install.log 2>&1 || { tail -n 30 $(VENV)/install.log >&2; \
		echo "make: installing into $(VENV) failed; all of pip's output: $(VENV)/install.log" >&2; exit 1; }
	@touch $(STAMP)

setup: $(STAMP)

# make test runs make lint first: CI enforces ruff, mypy and the import contracts.
# It needs an etcd server binary too: the cluster tests start a real one (logstore/dev/etcd_process.py),
# and Debian's chromium + chromedriver: tests/cli/test_console_browser.py drives the web console with them.
# The suite runs on TEST_WORKERS pytest-xdist workers, each taking whole test files (module-scoped
# brokers and clusters stay one per file); much of it waits on brokers, elections and JVMs, so two
# workers on two cores finish sooner than one. Each worker has its own SparkSession.
TEST_WORKERS ?= 2
test: lint etcd chromium kafka-jars spark-packages
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

# Delta's JVM package, resolved into Ivy's cache once before the suite: its workers then start
# their SparkSessions at the same moment without two Ivy resolutions downloading the same jars.
spark-packages: $(STAMP)
	@$(PY) -c "from jobs.spark_session import local_session; local_session('resolve packages', delta=True).stop()"

# ruff, mypy on every package, and the import contracts of .importlinter (DESIGN.md section 4).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy $(PACKAGES)
	$(VENV)/bin/lint-imports

demo: $(STAMP)
	@$(PY) -m jobs.demo

# bench_replication.py (matched by the glob) starts etcd + 3 brokers: it needs `make etcd`.
bench: $(STAMP) etcd
	set -e; for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b; done

# The replication figures of issue 11 alone (~4 minutes): a 3-broker cluster on etcd next to the
# single broker. Run it on an otherwise idle machine: it prints the load average it saw.
# The compaction job on a Spark standalone cluster (1 vs 2 workers) and Spark on Parquet:
# a master and workers started from the pip-installed PySpark (also part of `make bench`).
bench-compaction-cluster: $(STAMP)
	$(PY) benchmarks/bench_compaction_cluster.py

bench-replication: $(STAMP) etcd
	cat /proc/loadavg
	$(PY) benchmarks/bench_replication.py

# The same benchmarks side by side with a real single-node Apache Kafka (KRaft) started by
# benchmarks/kafka_server.py from jars that Maven resolves once into $(KAFKA_JARS), and
# confluent-kafka (the `bench` extra, installed only here: make test/demo do not need it).
# Without mvn, Java or the network each script says why and runs its usual baselines.
BENCH_STAMP := $(VENV)/.installed-bench
KAFKA_JARS ?= .cache/kafka-jars
KAFKA_BENCHES := bench_produce bench_consume_kafka bench_latency bench_spark_write bench_spark_read

$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[spark,dev,bench]'
	@touch $(BENCH_STAMP)

bench-kafka: $(BENCH_STAMP)
	cat /proc/loadavg
	set -e; for b in $(KAFKA_BENCHES); do echo "== benchmarks/$$b.py --kafka"; \
		LOGSTORE_KAFKA_JARS=$(KAFKA_JARS) $(PY) benchmarks/$$b.py --kafka; done

# etcd, the cluster's metadata store (DESIGN.md section 4b), as a real server binary in
# $(ETCD_BIN). Debian's etcd-server package is older than the 3.6 server we test against and
# needs root, so we build the pinned release from the Go module proxy in a throwaway module
# under .tools/etcd-build/ (about a minute, once). Without Go, an `etcd` already on PATH is used
# (logstore/dev/etcd_process.find_etcd looks there too); without either, one line says what to do.
ETCD_VERSION ?= v3.6.16
TOOLS := .tools
ETCD_BIN := $(TOOLS)/bin/etcd
ETCD_BUILD := $(TOOLS)/etcd-build

etcd:
	@if [ -x $(ETCD_BIN) ]; then exit 0; \
	elif command -v go >/dev/null 2>&1; then \
		echo "building etcd $(ETCD_VERSION) into $(ETCD_BIN) (once)"; \
		mkdir -p $(ETCD_BUILD) $(TOOLS)/bin && cd $(ETCD_BUILD) && \
		printf 'module logstore.local/etcd-build\n\ngo 1.21\n\nrequire go.etcd.io/etcd/server/v3 $(ETCD_VERSION)\n' > go.mod && \
		printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' > tools.go && \
		go mod tidy && go build -o ../bin/etcd go.etcd.io/etcd/server/v3; \
	elif command -v etcd >/dev/null 2>&1; then \
		echo "go not found: using $$(command -v etcd) ($$(etcd --version | head -1))"; \
	else \
		echo "make etcd: neither Go (to build etcd $(ETCD_VERSION)) nor an etcd on PATH; install Go or etcd-server" >&2; \
		exit 1; \
	fi

# Apache Kafka's jars, resolved from Maven Central once into .cache/kafka-jars (benchmarks/kafka_server.py):
# tests/broker/test_kafka_listener.py runs Kafka's own Java console producer and consumer against the
# Kafka listener with them. Without mvn (or Maven Central) that one test says it skipped, and why.
kafka-jars: $(STAMP)
	@$(PY) benchmarks/kafka_server.py --resolve >&2 || echo "make kafka-jars: no Kafka jars; the Java-client test of tests/broker/test_kafka_listener.py will skip" >&2

# Debian's chromium and chromedriver for the console's browser test (tests/cli/test_console_browser.py)
# and `make screenshots`: installed with apt-get when /usr/bin/chromium is missing (as root, else sudo).
chromium:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then exit 0; \
	elif command -v apt-get >/dev/null 2>&1; then \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		echo "installing chromium and chromium-driver (once)"; \
		$$SUDO apt-get install -y chromium chromium-driver || \
		{ $$SUDO apt-get update && $$SUDO apt-get install -y chromium chromium-driver; }; \
	else \
		echo "make chromium: no apt-get; install chromium and its chromedriver at /usr/bin" >&2; \
		exit 1; \
	fi

# The web console's screenshots in docs/operations.md (tests/screenshots/*.png): a broker with a little data, the console,
# and headless chromium saving each page. Rewrites the committed PNGs: run it by hand, then commit.
screenshots: $(STAMP) chromium
	$(PY) tests/support/console_screenshots.py --out tests/screenshots

# The long fault-harness run (tests/support/cluster_harness.py): 3 brokers + etcd, an acks=all writer and
# 100 faults (SIGKILL a leader, SIGSTOP a broker, cut a link); exit 1 on any loss. CHAOS_FAULTS=N.
CHAOS_FAULTS ?= 100
chaos: $(STAMP) etcd
	$(PY) benchmarks/chaos.py --faults $(CHAOS_FAULTS)

# Producers that recover by themselves (issue 22): one idempotent and one transactional
# producer kept for the whole run, a consumer group, the same nemesis; stalls after each heal.
LIVENESS_FAULTS ?= 40
chaos-liveness: $(STAMP) etcd
	$(PY) benchmarks/chaos_liveness.py --faults $(LIVENESS_FAULTS)

# The long run of the RPC fuzzer (tests/support/fuzz_driver.py; tests/chaos/test_fuzz_rpc.py is its short run in
# make test): hostile requests to every RPC of a child broker for FUZZ_MINUTES each, an
# unauthenticated one and a SASL one with the authorizer on, then a report
# (requests, distinct error codes, max RSS, crashes, findings); exit 1 on any finding.
FUZZ_MINUTES ?= 10
fuzz: $(STAMP)
	cd tests/support && ../../$(PY) fuzz_driver.py --minutes $(FUZZ_MINUTES) --mode plaintext
	cd tests/support && ../../$(PY) fuzz_driver.py --minutes $(FUZZ_MINUTES) --mode sasl

proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --pyi_out=. logstore/_proto/logstore.proto

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache $(TOOLS)
