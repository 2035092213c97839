CARGO ?= cargo
TARGET_DIR ?= $(or $(CARGO_TARGET_DIR),target)

.PHONY: build test lint demo install bench

build:
	$(CARGO) build --release

test:
	$(CARGO) test --all-targets

lint:
	$(CARGO) fmt --check
	$(CARGO) clippy --all-targets -- -D warnings

demo:
	$(CARGO) build --release --bins
	python3 examples/demo.py target/release/mcp-retry target/release/mock-mcp-server

install:
	$(CARGO) install --path . --bin mcp-retry

# Measures mcp-retry against a direct connection and a byte relay (see
# examples/bench.rs) and writes the results into BENCHMARKS.md.
bench:
	$(CARGO) build --release --bins --example bench
	$(TARGET_DIR)/release/examples/bench --write BENCHMARKS.md
