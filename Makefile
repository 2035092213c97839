CARGO ?= cargo
PYTHON ?= python3
NPM ?= npm
INTEROP := tests/interop
# Seconds each fuzz target runs under `make fuzz`.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := jsonrpc config

.PHONY: build test lint demo install interop fuzz fuzz-replay

build:
	$(CARGO) build --release

test:
	$(CARGO) test --all-targets

lint:
	$(CARGO) fmt --check
	$(CARGO) fmt --check --manifest-path fuzz/Cargo.toml
	$(CARGO) clippy --all-targets -- -D warnings

demo:
	$(CARGO) build --release --bins
	python3 examples/demo.py target/release/mcp-retry target/release/mock-mcp-server

install:
	$(CARGO) install --path . --bin mcp-retry

# Real clients and real servers, direct and through the proxy (see
# tests/interop/run.py). The pinned packages are installed into
# tests/interop/node_modules and tests/interop/.venv, never globally.
interop: $(INTEROP)/node_modules/.installed $(INTEROP)/.venv/.installed
	$(CARGO) build --release --bin mcp-retry
	$(INTEROP)/.venv/bin/python $(INTEROP)/run.py --proxy target/release/mcp-retry

$(INTEROP)/node_modules/.installed: $(INTEROP)/package.json $(INTEROP)/package-lock.json
	cd $(INTEROP) && $(NPM) ci --no-audit --no-fund
	touch $@

$(INTEROP)/.venv/.installed: $(INTEROP)/requirements.txt
	rm -rf $(INTEROP)/.venv
	$(PYTHON) -m venv $(INTEROP)/.venv
	$(INTEROP)/.venv/bin/pip install --disable-pip-version-check --no-input -q -r $(INTEROP)/requirements.txt
	touch $@

# libFuzzer on each target for FUZZ_SECONDS (needs the nightly toolchain;
# installs cargo-fuzz if missing). New inputs go to fuzz/corpus/ (not
# committed); crashes to fuzz/artifacts/.
fuzz:
	@rustup toolchain list | grep -q '^nightly' || { \
		echo "make fuzz needs the nightly toolchain: rustup toolchain install nightly"; exit 1; }
	@$(CARGO) fuzz --version >/dev/null 2>&1 || $(CARGO) install cargo-fuzz
	cd fuzz && for t in $(FUZZ_TARGETS); do \
		mkdir -p corpus/$$t && \
		$(CARGO) +nightly fuzz run $$t corpus/$$t seeds/$$t -- \
			-max_total_time=$(FUZZ_SECONDS) -max_len=65536 || exit 1; \
	done

# The same checks over the committed seeds, on the stable toolchain.
fuzz-replay:
	cd fuzz && for t in $(FUZZ_TARGETS); do \
		$(CARGO) run --quiet --no-default-features --bin replay -- $$t seeds/$$t || exit 1; \
	done
