// The npm launcher's choice of platform package (packaging/npm/mcp-retry/
// bin/mcp-retry.js): its table, and the launcher run under a faked
// process.platform and process.arch, beside stand-in platform packages whose
// "binary" is a script that prints its package's name, so the package it
// starts is the one it chose. Run by `make packages` (node --test).
'use strict';

const test = require('node:test');
const assert = require('node:assert');
const { spawnSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const LAUNCHER = path.resolve(__dirname, '../../packaging/npm/mcp-retry/bin/mcp-retry.js');
const { binaryFor } = require(LAUNCHER);

test('each platform and architecture with a binary names its package', () => {
  const want = [
    ['linux', 'x64', '@mcp-retry/linux-x64', 'mcp-retry'],
    ['linux', 'arm64', '@mcp-retry/linux-arm64', 'mcp-retry'],
    ['darwin', 'arm64', '@mcp-retry/darwin-arm64', 'mcp-retry'],
    ['darwin', 'x64', '@mcp-retry/darwin-x64', 'mcp-retry'],
    ['win32', 'x64', '@mcp-retry/win32-x64', 'mcp-retry.exe'],
  ];
  for (const [platform, arch, pkg, exe] of want) {
    assert.deepStrictEqual(binaryFor(platform, arch), { pkg, exe }, `${platform} ${arch}`);
  }
});

test('a platform or architecture without a binary names no package', () => {
  for (const [platform, arch] of [['darwin', 'ia32'], ['freebsd', 'x64'], ['win32', 'arm64'], ['linux', 'riscv64']]) {
    assert.strictEqual(binaryFor(platform, arch).pkg, undefined, `${platform} ${arch}`);
  }
});

// A directory laid out as npm installs the launcher, with stand-in platform
// packages for `installed` (names without the scope).
function install(installed) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'mcp-retry-launcher-'));
  const bin = path.join(dir, 'node_modules', 'mcp-retry', 'bin');
  fs.mkdirSync(bin, { recursive: true });
  fs.copyFileSync(LAUNCHER, path.join(bin, 'mcp-retry.js'));
  for (const name of installed) {
    const pkgBin = path.join(dir, 'node_modules', '@mcp-retry', name, 'bin');
    fs.mkdirSync(pkgBin, { recursive: true });
    fs.writeFileSync(path.join(pkgBin, 'mcp-retry'), `#!/bin/sh\necho "${name} $*"\n`, { mode: 0o755 });
  }
  const shim = path.join(dir, 'fake-platform.js');
  fs.writeFileSync(shim, [
    "Object.defineProperty(process, 'platform', { value: process.env.FAKE_PLATFORM });",
    "Object.defineProperty(process, 'arch', { value: process.env.FAKE_ARCH });",
    '',
  ].join('\n'));
  return { dir, launcher: path.join(bin, 'mcp-retry.js'), shim };
}

function launch({ launcher, shim }, platform, arch) {
  const env = { ...process.env, FAKE_PLATFORM: platform, FAKE_ARCH: arch };
  delete env.MCP_RETRY_BINARY;
  return spawnSync(process.execPath, ['--require', shim, launcher, '--version'], {
    env, encoding: 'utf8', timeout: 60000,
  });
}

test('under a faked platform the launcher starts the binary of its package', (t) => {
  const all = ['linux-x64', 'linux-arm64', 'darwin-arm64', 'darwin-x64'];
  const setup = install(all);
  t.after(() => fs.rmSync(setup.dir, { recursive: true, force: true }));
  for (const [platform, arch, name] of [
    ['darwin', 'arm64', 'darwin-arm64'],
    ['darwin', 'x64', 'darwin-x64'],
    ['linux', 'x64', 'linux-x64'],
    ['linux', 'arm64', 'linux-arm64'],
  ]) {
    const done = launch(setup, platform, arch);
    assert.strictEqual(done.status, 0, `${platform} ${arch}: ${done.stderr}`);
    assert.strictEqual(done.stdout, `${name} --version\n`, `${platform} ${arch}`);
  }
});

test('on macOS without its platform package the launcher names the package', (t) => {
  const setup = install(['darwin-x64']);
  t.after(() => fs.rmSync(setup.dir, { recursive: true, force: true }));
  const done = launch(setup, 'darwin', 'arm64');
  assert.strictEqual(done.status, 1);
  assert.strictEqual(done.stdout, '');
  assert.match(done.stderr, /the package @mcp-retry\/darwin-arm64 with the binary for darwin-arm64 is not installed/);
  assert.match(done.stderr, /cargo install mcp-retry --locked/);
});

test('on a platform without a binary the launcher lists the other ways', (t) => {
  const setup = install(['darwin-arm64', 'darwin-x64']);
  t.after(() => fs.rmSync(setup.dir, { recursive: true, force: true }));
  const done = launch(setup, 'darwin', 'ia32');
  assert.strictEqual(done.status, 1);
  assert.strictEqual(done.stdout, '');
  assert.match(done.stderr, /there is no prebuilt binary for darwin-ia32/);
  assert.match(done.stderr, /pip install mcp-retry-rs/);
});
