CARGO ?= cargo
PYTHON ?= python3
NPM ?= npm
INTEROP := tests/interop
# make packages and make dist: the install checks and their venv (maturin, uv).
PACKAGES := tests/packages
# Seconds each fuzz target runs under `make fuzz`.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := jsonrpc config sse http yaml

TARGET_DIR ?= $(or $(CARGO_TARGET_DIR),target)
STATIC_TARGET ?= x86_64-unknown-linux-musl
# `make static` fails when the binary (with TLS) reaches these sizes: the
# project's 6 MB for the musl one (5,710,328 bytes, 2.83 MB gzipped, at
# opt-level "s" with mimalloc, redb and redis; 5,689,848 before a client's
# line was read in one pass, 5,648,824 before a message
# was read once at the edge; 5,489,080 before the store's
# reports in status and check, 5,218,744 before redis,
# 4,174,136 before redb); the glibc
# fallback has about 1 MB of glibc's own static code more (see
# docs/platforms.md, *Static binary*).
STATIC_MAX_BYTES ?= 6000000
GLIBC_STATIC_MAX_BYTES ?= 7000000

WINDOWS_TARGET := x86_64-pc-windows-gnu
# Wine's own state for `make test-windows` (a Windows "C:" drive and
# registry), kept with the build output.
WINEPREFIX_DIR ?= $(abspath $(TARGET_DIR))/wine-prefix
WINE_ENV := WINEPREFIX=$(WINEPREFIX_DIR) WINEDEBUG=-all WINEDLLOVERRIDES='mscoree,mshtml='

.PHONY: build test test-redis test-stress test-windows wine-prefix dist dist-plan lint docs demo install interop fuzz fuzz-replay bench outage static packages darwin

build:
	$(CARGO) build --release

# With the fault hook of the integration tests (`fault-inject`, see
# src/guard.rs), which no release build has.
test:
	$(CARGO) test --workspace --all-targets --features mcp-retry/fault-inject

# The Redis store's suite (tests/redis.rs): each test starts its own
# redis-server on a free loopback port and kills it at its end. Installs
# redis-server (and openssl, for the rediss:// test's certificates) with
# apt-get when missing; MCP_RETRY_REDIS_REQUIRED makes a missing server a
# failure here (a plain `cargo test` run of the suite says it skipped).
test-redis:
	@missing=; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v openssl >/dev/null || missing="$$missing openssl"; \
	.ci/apt-install 'make test-redis' $$missing
	MCP_RETRY_REDIS_REQUIRED=1 $(CARGO) test --features mcp-retry/redis-tests --test redis

# `make test` on a loaded machine, with every test duration three times
# longer (MCP_RETRY_TEST_TIME_SCALE, see docs/testing.md): two busy loops
# and a `cargo build -j2` of the crate into a target directory of its own
# (built again from scratch until the tests end) take the cores meanwhile.
# What a shared CI machine does to `make test`; it must pass every time.
STRESS_SCALE ?= 3
STRESS_BUILD_DIR := $(abspath $(TARGET_DIR))/stress-build
test-stress:
	$(CARGO) test --workspace --all-targets --features mcp-retry/fault-inject --no-run
	@load=; \
	for i in 1 2; do setsid sh -c 'while :; do :; done' & load="$$load $$!"; done; \
	setsid sh -c 'while :; do $(CARGO) build -j2 --quiet --target-dir "$(STRESS_BUILD_DIR)" >/dev/null 2>&1; rm -rf "$(STRESS_BUILD_DIR)"; done' & \
	load="$$load $$!"; \
	trap 'for p in $$load; do kill -- -$$p 2>/dev/null; done; rm -rf "$(STRESS_BUILD_DIR)"' EXIT INT TERM; \
	echo "make test-stress: MCP_RETRY_TEST_TIME_SCALE=$(STRESS_SCALE), load:$$load"; \
	MCP_RETRY_TEST_TIME_SCALE=$(STRESS_SCALE) $(CARGO) test --workspace --all-targets --features mcp-retry/fault-inject

# The Windows build, run under Wine: the binary, the mock server and the
# test binaries for x86_64-pc-windows-gnu, unit and integration tests run
# with `wine` as cargo's runner (tests that need Unix are cfg(unix)).
# Installs what is missing: the rustup target, and with apt-get the mingw
# linker and Wine. Wine 8 has no bcryptprimitives.dll, whose ProcessPrng
# std imports: tests/wine/bcryptprimitives.c stands in for it.
test-windows: wine-prefix
	$(WINE_ENV) CARGO_TARGET_X86_64_PC_WINDOWS_GNU_RUNNER=wine \
		$(CARGO) test --target '$(WINDOWS_TARGET)' --bins --tests; \
		status=$$?; $(WINE_ENV) wineserver -k 2>/dev/null; exit $$status

# The Windows target, mingw, Wine and a Wine prefix in which std's binaries
# run (for test-windows and dist).
wine-prefix:
	@rustup target list --installed | grep -qx '$(WINDOWS_TARGET)' || rustup target add '$(WINDOWS_TARGET)'
	@missing=; \
	command -v x86_64-w64-mingw32-gcc >/dev/null || missing="$$missing gcc-mingw-w64-x86-64"; \
	command -v wine >/dev/null || missing="$$missing wine64 wine"; \
	.ci/apt-install 'make test-windows' $$missing
	@mkdir -p '$(TARGET_DIR)/wine'
	x86_64-w64-mingw32-gcc -O2 -shared -o '$(TARGET_DIR)/wine/bcryptprimitives.dll' \
		tests/wine/bcryptprimitives.c tests/wine/bcryptprimitives.def -ladvapi32
	@if [ ! -d '$(WINEPREFIX_DIR)/drive_c/windows/system32' ]; then \
	  echo "make test-windows: creating the Wine prefix $(WINEPREFIX_DIR)"; \
	  $(WINE_ENV) wineboot --init >/dev/null 2>&1 || true; \
	  $(WINE_ENV) wineserver -w; \
	fi
	cp '$(TARGET_DIR)/wine/bcryptprimitives.dll' '$(WINEPREFIX_DIR)/drive_c/windows/system32/'

# Release binaries for Linux (x86_64, aarch64; static, musl), Windows
# (x86_64) and macOS (arm64, x86_64; `make darwin`) in dist/, with SHA-256
# files, and their npm packages, wheels and the sdist; see .ci/dist. Not run
# in CI (`make packages` is, with the macOS binaries). It first says what it
# will install (.ci/dist-plan): rustup targets, Debian packages, local tools.
dist: dist-plan $(PACKAGES)/.venv/.installed darwin
	CARGO='$(CARGO)' TARGET_DIR='$(TARGET_DIR)' WINEPREFIX_DIR='$(WINEPREFIX_DIR)' \
		DARWIN_OUT='$(DARWIN_OUT)' DARWIN_MAX_BYTES='$(DARWIN_MAX_BYTES)' $(ZIG_PATH) \
		MATURIN='$(PACKAGES)/.venv/bin/maturin' .ci/dist

dist-plan:
	@TARGET_DIR='$(TARGET_DIR)' RCODESIGN='$(RCODESIGN)' .ci/dist-plan

# The crates as crates.io would get them (`cargo package`: each must build
# from its package alone), then the npm packages and the Python wheels for
# x86_64 Linux, from the binary `make static` builds, and for macOS, from
# the binaries `make darwin` builds (maturin finds them up to date and
# compiles nothing). The Linux ones are installed and run as a user would
# (tests/packages/check.py): npx from the tarballs, pip into a fresh venv,
# uvx --from the wheel; the macOS ones are checked as far as Linux can
# (tests/packages/macho.py on the binary each package carries), and the
# launcher's choice of package under a faked platform by node's test
# runner (tests/packages/launcher.test.js). `make dist` packs every
# platform. maturin, uv and zig (pinned) are installed into
# tests/packages/.venv, never globally.
PACKAGES_OUT := $(TARGET_DIR)/packages
# `cargo package --workspace` verifies each crate against a temporary
# registry of the workspace's own crates. Cargo takes a registry crate of a
# version it has unpacked or built before as unchanged, so a crate of ours
# changed without a new version number would be verified as an earlier run
# left it: the verification builds in a target directory of its own, from
# which our crates' earlier builds are removed, as are their unpacked
# copies under $CARGO_HOME/registry/src/-<hash>/.
PACKAGE_TARGET := $(abspath $(TARGET_DIR))/package-verify
OURS := mcp-retry-jsonrpc mcp-retry-yaml
OURS_BUILT = $(foreach c,$(OURS),$(or $(CARGO_HOME),$(HOME)/.cargo)/registry/src/-*/$(c)-* \
	$(PACKAGE_TARGET)/debug/.fingerprint/$(c)-* $(PACKAGE_TARGET)/debug/deps/lib$(subst -,_,$(c))-*)
packages: static darwin $(PACKAGES)/.venv/.installed
	node --test $(PACKAGES)/launcher.test.js
	rm -rf $(OURS_BUILT)
	CARGO_TARGET_DIR='$(PACKAGE_TARGET)' $(CARGO) package --workspace --locked --allow-dirty
	$(CARGO) build --features mock-server --bin mock-mcp-server
	rm -rf '$(PACKAGES_OUT)'
	CC_x86_64_unknown_linux_musl=musl-gcc $(ZIG_PATH) $(PYTHON) packaging/pack.py '$(PACKAGES_OUT)' \
		$(PACKAGES)/.venv/bin/maturin \
		$(STATIC_TARGET)=$(TARGET_DIR)/$(STATIC_TARGET)/release/mcp-retry \
		$(foreach t,$(DARWIN_TARGETS),$(t)=$(DARWIN_OUT)/mcp-retry-$(t))
	$(PACKAGES)/.venv/bin/python $(PACKAGES)/check.py '$(PACKAGES_OUT)' \
		$(TARGET_DIR)/debug/mock-mcp-server $(PACKAGES)/.venv/bin/uvx

# macOS binaries (Apple silicon and Intel) with TLS (`tls`; not
# `redis-tls`, which needs Apple's Security framework), cross-built without
# Apple's SDK: `maturin build --zig` (maturin
# runs cargo-zigbuild, which links with zig, the ziglang package in
# tests/packages/.venv; zig also compiles ring's C) writes the release build
# that pack.py's `maturin --zig` then finds up to date. Each is ad-hoc
# signed (Apple silicon runs no unsigned code) by rcodesign (the
# apple-codesign crate, pinned, installed with cargo into
# $(TARGET_DIR)/tools) into $(DARWIN_OUT)/mcp-retry-<target>, and checked
# without a Mac (tests/packages/macho.py): Mach-O header and architecture,
# minimum macOS (11.0 and 10.12, the wheel tags' and rustc's defaults), only
# system libraries linked, the signature's hashes; and that it has TLS, no
# fault hook and stays under DARWIN_MAX_BYTES. Nothing runs them here: see
# docs/platforms.md (*macOS*). zig links without the SDK and says so once
# per target (a warning about `xcrun`).
DARWIN_TARGETS := aarch64-apple-darwin x86_64-apple-darwin
DARWIN_OUT := $(TARGET_DIR)/darwin
DARWIN_MAX_BYTES ?= 6000000
RCODESIGN_VERSION := 0.29.0
RCODESIGN := $(TARGET_DIR)/tools/rcodesign-$(RCODESIGN_VERSION)/bin/rcodesign
# maturin finds zig as `python3 -m ziglang`, with the venv's python first.
ZIG_PATH := PATH='$(abspath $(PACKAGES)/.venv/bin)':"$$PATH"

darwin: $(PACKAGES)/.venv/.installed $(RCODESIGN)
	@for t in $(DARWIN_TARGETS); do \
	  rustup target list --installed | grep -qx "$$t" || rustup target add "$$t" || exit 1; \
	done
	@set -e; mkdir -p '$(DARWIN_OUT)'; \
	for t in $(DARWIN_TARGETS); do \
	  $(ZIG_PATH) $(PACKAGES)/.venv/bin/maturin build --release --zig --target "$$t" \
	    --no-default-features --features tls --manifest-path '$(CURDIR)/Cargo.toml' --out '$(DARWIN_OUT)/wheels'; \
	  bin='$(DARWIN_OUT)'/mcp-retry-$$t; \
	  $(RCODESIGN) sign --binary-identifier mcp-retry '$(TARGET_DIR)'/$$t/release/mcp-retry "$$bin"; \
	  grep -q 'rustls-' "$$bin" || { echo "make darwin: $$bin has no TLS (rustls)" >&2; exit 1; }; \
	  ! grep -q MCP_RETRY_FAULT "$$bin" || { echo "make darwin: $$bin has the fault hook of the tests" >&2; exit 1; }; \
	  size=$$(wc -c < "$$bin"); \
	  if [ "$$size" -ge $(DARWIN_MAX_BYTES) ]; then echo "make darwin: $$bin is $$size bytes, over $(DARWIN_MAX_BYTES)" >&2; exit 1; fi; \
	done
	$(PYTHON) $(PACKAGES)/macho.py arm64 11.0 '$(DARWIN_OUT)/mcp-retry-aarch64-apple-darwin'
	$(PYTHON) $(PACKAGES)/macho.py x86_64 10.12 '$(DARWIN_OUT)/mcp-retry-x86_64-apple-darwin'
	MACHO_TEST_BINARY='$(DARWIN_OUT)/mcp-retry-aarch64-apple-darwin' \
		MACHO_TEST_BINARY_X86_64='$(DARWIN_OUT)/mcp-retry-x86_64-apple-darwin' \
		$(PYTHON) -m unittest discover -s $(PACKAGES) -p 'test_macho.py'

# Without the `notarize` feature (an AWS SDK for Apple's notary service,
# which ad-hoc signing does not use), and unoptimised (--debug): it builds in
# 2 minutes of CPU instead of 5.5 and signs the same bytes in a fraction of
# a second. No registry ships it prebuilt (PyPI has no rcodesign).
$(RCODESIGN):
	$(CARGO) install apple-codesign@$(RCODESIGN_VERSION) --locked --debug --no-default-features \
		--bin rcodesign --root '$(abspath $(TARGET_DIR))/tools/rcodesign-$(RCODESIGN_VERSION)'

$(PACKAGES)/.venv/.installed: $(PACKAGES)/requirements.txt
	rm -rf $(PACKAGES)/.venv
	$(PYTHON) -m venv $(PACKAGES)/.venv
	$(PACKAGES)/.venv/bin/pip install --disable-pip-version-check --no-input -q -r $(PACKAGES)/requirements.txt
	touch $@

# Clippy for Linux, macOS (Intel and Apple silicon) and Windows: checking
# needs only each target's std, which rustup adds when missing (no linker,
# no SDK). The bench example is Linux-only (/proc, Unix pipes), so Windows
# checks the binaries and tests.
LINT_TARGETS := x86_64-apple-darwin aarch64-apple-darwin $(WINDOWS_TARGET)

lint:
	$(CARGO) fmt --check
	$(CARGO) fmt --check --manifest-path fuzz/Cargo.toml
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy --features redis-tests --test redis -- -D warnings
	@for t in $(LINT_TARGETS); do \
	  rustup target list --installed | grep -qx "$$t" || rustup target add "$$t" || exit 1; \
	done
	@# Without the `tls` feature: ring's C code needs a C compiler for the
	@# target, which lint does not install (zig for macOS comes with
	@# `make darwin`, mingw with `make test-windows`; both build with TLS).
	$(CARGO) clippy --no-default-features --target x86_64-apple-darwin --all-targets -- -D warnings
	$(CARGO) clippy --no-default-features --target aarch64-apple-darwin --all-targets -- -D warnings
	$(CARGO) clippy --no-default-features --target $(WINDOWS_TARGET) --bins --tests -- -D warnings

# Regenerates docs/configuration.md's config key table and the `defaults:` part of
# examples/mcp-retry.yaml from the key table in src/config/keys.rs. The test
# that otherwise fails when they are out of date writes them instead.
docs:
	MCP_RETRY_WRITE_DOCS=1 $(CARGO) test --quiet --lib config::docs::tests::key_table_and_example_are_up_to_date

# The `fast` profile (Cargo.toml): no LTO, parallel codegen, so a fresh
# clone shows the demo in about a minute. `install`, `static`, `bench` and
# `build` keep the fully optimised release profile.
demo:
	$(CARGO) build --profile fast --bins --features mock-server
	python3 examples/demo.py $(TARGET_DIR)/fast/mcp-retry $(TARGET_DIR)/fast/mock-mcp-server

install:
	$(CARGO) install --path . --bin mcp-retry --locked

# Real clients and real servers, direct and through the proxy (see
# tests/interop/run.py). The pinned packages are installed into
# tests/interop/node_modules and tests/interop/.venv, never globally.
interop: $(INTEROP)/node_modules/.installed $(INTEROP)/.venv/.installed
	$(CARGO) build --profile fast --bin mcp-retry
	$(INTEROP)/.venv/bin/python $(INTEROP)/run.py --proxy $(TARGET_DIR)/fast/mcp-retry

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

# Measures mcp-retry against a direct connection and a byte relay (see
# examples/bench.rs) and writes the results into BENCHMARKS.md.
# BENCH_OTEL (make variable or environment) adds mcp-retry with
# OpenTelemetry export on to the same rounds: `closed` (a loopback port
# nothing listens on: the collector is down), `sink` (a receiver in the
# bench that takes everything) or a collector's URL.
BENCH_OTEL ?=
# mcp-retry is the release build; the bench, its relays and the mock server
# are built with the `bench-tools` profile (opt-level 3, see Cargo.toml).
# Where valgrind is installed, the `profiling` build (the release build with
# its symbols) is counted under callgrind too: the dispatcher's and the whole
# process's instructions per pipelined call (the bench says when they are
# not measured). `make bench BENCH_ARGS=--instructions-only` runs just that.
BENCH_ARGS ?=
bench:
	$(CARGO) build --release --bin mcp-retry
	$(CARGO) build --profile bench-tools --features mock-server --bin mock-mcp-server --example bench
	@if command -v valgrind >/dev/null; then \
	  $(CARGO) build --profile profiling --bin mcp-retry; \
	else \
	  echo "make bench: valgrind is not installed; no instruction counts"; \
	fi
	MCP_RETRY_BIN=$(TARGET_DIR)/release/mcp-retry $(TARGET_DIR)/bench-tools/examples/bench \
		$(if $(BENCH_OTEL),--otel '$(BENCH_OTEL)') \
		$(if $(shell command -v valgrind),--profiled $(TARGET_DIR)/profiling/mcp-retry) \
		$(BENCH_ARGS) --write BENCHMARKS.md

# Outage recovery (see examples/outage.rs): a client calling tools every
# 0.5 s through mcp-retry (default config), with no proxy, and (where npm
# is) through mcp-remote, while a stdio server and a Streamable HTTP server
# are killed at t = 3 s and come back D = 3, 6 and 20 s later. Prints the
# figures, writes them into BENCHMARKS.md and fails when an mcp-retry run
# misses a target. About 3 minutes. Not part of CI. OUTAGE_ARGS adds
# options, e.g. OUTAGE_ARGS='--outages 6 --only http --keep'. mcp-remote
# (pinned) is installed into tests/outage/node_modules, never globally.
OUTAGE_ARGS ?=
OUTAGE := tests/outage
outage: $(if $(shell command -v $(NPM)),$(OUTAGE)/node_modules/.installed)
	$(CARGO) build --release --bin mcp-retry
	$(CARGO) build --profile bench-tools --features mock-server --bin mock-mcp-server --example outage
	MCP_RETRY_BIN=$(TARGET_DIR)/release/mcp-retry $(TARGET_DIR)/bench-tools/examples/outage --write BENCHMARKS.md $(OUTAGE_ARGS)

$(OUTAGE)/node_modules/.installed: $(OUTAGE)/package.json $(OUTAGE)/package-lock.json
	cd $(OUTAGE) && $(NPM) ci --no-audit --no-fund
	touch $@

# A statically linked release binary: musl when that target is (or can be)
# installed, else glibc with crt-static. Checks that it is static, runs with
# an empty environment, has no fault hook (the `fault-inject` feature of
# the tests) and stays under STATIC_MAX_BYTES (glibc:
# GLIBC_STATIC_MAX_BYTES); prints its path and size, raw and gzipped.
# TLS (rustls and ring, for https:// remote servers and collectors) is
# about a quarter of it; a build with `--no-default-features` leaves it
# out. .ci/run runs it, so a
# binary that grows past the limit fails CI.
static:
	@set -e; \
	if rustup target list --installed 2>/dev/null | grep -qx '$(STATIC_TARGET)' \
	    || rustup target add '$(STATIC_TARGET)'; then \
	  target='$(STATIC_TARGET)'; max=$(STATIC_MAX_BYTES); \
	  command -v musl-gcc >/dev/null || .ci/apt-install 'make static (ring compiles C for musl)' musl-tools; \
	  CC_x86_64_unknown_linux_musl=musl-gcc $(CARGO) build --release --bin mcp-retry --target "$$target"; \
	else \
	  echo "make static: $(STATIC_TARGET) is not available; using glibc with crt-static" >&2; \
	  target=x86_64-unknown-linux-gnu; max=$(GLIBC_STATIC_MAX_BYTES); \
	  RUSTFLAGS='-C target-feature=+crt-static' $(CARGO) build --release --bin mcp-retry --target "$$target"; \
	fi; \
	bin="$(TARGET_DIR)/$$target/release/mcp-retry"; \
	if command -v file >/dev/null; then \
	  file "$$bin" | grep -Eq 'statically linked|static-pie linked'; \
	else \
	  ! ldd "$$bin" 2>&1 | grep -q '=>'; \
	fi || { echo "make static: $$bin is not statically linked" >&2; exit 1; }; \
	env -i "$$bin" --version >/dev/null; \
	! grep -q MCP_RETRY_FAULT "$$bin" || { echo "make static: $$bin has the test's fault hook (fault-inject)" >&2; exit 1; }; \
	size=$$(wc -c < "$$bin"); \
	if [ "$$size" -ge "$$max" ]; then echo "make static: $$bin is $$size bytes, over $$max" >&2; exit 1; fi; \
	gz=$$(gzip -9c "$$bin" | wc -c); \
	echo "$$bin: $$size bytes ($$(awk "BEGIN { printf \"%.2f\", $$size / 1000000 }") MB; gzipped $$gz bytes, $$(awk "BEGIN { printf \"%.2f\", $$gz / 1000000 }") MB), statically linked"
