CARGO ?= cargo

.PHONY: build test lint demo install

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
