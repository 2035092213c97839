CARGO ?= cargo
PYTHON ?= python3
NPM ?= npm
INTEROP := tests/interop

.PHONY: build test lint demo install interop

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
