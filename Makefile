# One-command set-up: `make serve` and `make test` create .venv, build the extension
# and install what they need; native builds are cached per user (see `native`).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
ENGINE ?= llama

.PHONY: all venv develop native node-clients serve test test-rust test-python lint bench bench-ci clean

all: develop

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip 'maturin>=1.7,<2'

venv: $(BIN)/python

# Builds hotloop._core (release) and installs the package with its test and dev extras.
develop: venv
	$(BIN)/maturin develop --release -q -E test,dev,bench

# llama-cpp-python (GGML_NATIVE=OFF), the SmolLM2 GGUF and llama-server, built once per
# user into ~/.cache/hotloop/native and installed from there (python/hotloop/native_deps.py).
native: develop
	$(BIN)/python -m hotloop.native_deps

# The npm clients the tests drive (openai-node, the Vercel AI SDK), from their lockfiles.
node-clients:
	cd tests/node && npm ci --no-audit --no-fund --loglevel=error
	cd tests/aisdk && npm ci --no-audit --no-fund --loglevel=error

serve: develop native
	$(BIN)/hotloop serve --host $(HOST) --port $(PORT) --engine $(ENGINE)

test-rust:
	cargo test --manifest-path rust/Cargo.toml

test-python: develop native node-clients
	$(BIN)/pytest -q

test: test-rust test-python

lint: develop
	cargo fmt --all -- --check
	cargo clippy --all-targets -- -D warnings
	cargo clippy --all-targets --features python -- -D warnings
	$(BIN)/ruff check python tests benches
	$(BIN)/ruff format --check python tests benches
	$(BIN)/mypy python/

bench: develop native
	$(BIN)/pytest benches -q --benchmark-only

# CI's microbenchmarks: only ratios measured in one run, with wide margins (quick mode).
# `native` for the SmolLM2 GGUF that the open-model peer check reads.
bench-ci: develop native
	$(BIN)/pytest benches/test_ratios.py benches/test_store_ratios.py -q -s --benchmark-disable

clean:
	rm -rf $(VENV) target
