CARGO ?= cargo
TARGET_DIR ?= $(or $(CARGO_TARGET_DIR),target)
STATIC_TARGET ?= x86_64-unknown-linux-musl

.PHONY: build test lint demo install bench static

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

# A statically linked release binary: musl when that target is (or can be)
# installed, else glibc with crt-static. Checks that it is static, runs with
# an empty environment and stays under 3 MB; prints its path and size.
static:
	@set -e; \
	if rustup target list --installed 2>/dev/null | grep -qx '$(STATIC_TARGET)' \
	    || rustup target add '$(STATIC_TARGET)'; then \
	  target='$(STATIC_TARGET)'; \
	  $(CARGO) build --release --bin mcp-retry --target "$$target"; \
	else \
	  echo "make static: $(STATIC_TARGET) is not available; using glibc with crt-static" >&2; \
	  target=x86_64-unknown-linux-gnu; \
	  RUSTFLAGS='-C target-feature=+crt-static' $(CARGO) build --release --bin mcp-retry --target "$$target"; \
	fi; \
	bin="$(TARGET_DIR)/$$target/release/mcp-retry"; \
	if command -v file >/dev/null; then \
	  file "$$bin" | grep -Eq 'statically linked|static-pie linked'; \
	else \
	  ! ldd "$$bin" 2>&1 | grep -q '=>'; \
	fi || { echo "make static: $$bin is not statically linked" >&2; exit 1; }; \
	env -i "$$bin" --version >/dev/null; \
	size=$$(wc -c < "$$bin"); \
	if [ "$$size" -ge 3145728 ]; then echo "make static: $$bin is $$size bytes, over 3 MB" >&2; exit 1; fi; \
	echo "$$bin: $$size bytes ($$(awk "BEGIN { printf \"%.1f\", $$size / 1048576 }") MiB), statically linked"
