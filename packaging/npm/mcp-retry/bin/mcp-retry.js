#!/usr/bin/env node
// The `mcp-retry` command of the npm package: finds the prebuilt binary in
// the platform package npm installed beside this one (an optional
// dependency per platform: @mcp-retry/linux-x64, linux-arm64, darwin-arm64,
// darwin-x64, win32-x64) and runs it with the same arguments and stdio. It
// owns choosing that package, starting the binary, passing stop signals on
// and ending with its status; it knows nothing of MCP or of what the binary
// does. Required as a module (its tests), it only exports the choice.
'use strict';

const { spawn } = require('child_process');
const os = require('os');

// process.platform and process.arch to the package with that binary.
const PACKAGES = {
  'linux x64': '@mcp-retry/linux-x64',
  'linux arm64': '@mcp-retry/linux-arm64',
  'darwin arm64': '@mcp-retry/darwin-arm64',
  'darwin x64': '@mcp-retry/darwin-x64',
  'win32 x64': '@mcp-retry/win32-x64',
};

const OTHER_WAYS = [
  '  cargo install mcp-retry --locked        (any platform with a Rust toolchain)',
  '  pip install mcp-retry-rs                (or: uvx --from mcp-retry-rs mcp-retry)',
  '  a binary that `make dist` builds from a checkout of the source',
];

// The package and the file in it with the binary for this platform and
// architecture; no package when there is none for them.
function binaryFor(platform, arch) {
  const exe = platform === 'win32' ? 'mcp-retry.exe' : 'mcp-retry';
  return { pkg: PACKAGES[`${platform} ${arch}`], exe };
}

function fail(lines) {
  process.stderr.write(lines.map((l) => `mcp-retry: ${l}`).join('\n') + '\n');
  process.exit(1);
}

function binaryPath() {
  // An explicit binary, for platforms without a package or for testing one.
  if (process.env.MCP_RETRY_BINARY) return process.env.MCP_RETRY_BINARY;
  const platform = `${process.platform}-${process.arch}`;
  const { pkg, exe } = binaryFor(process.platform, process.arch);
  if (!pkg) {
    fail([`there is no prebuilt binary for ${platform}. Other ways to install:`, ...OTHER_WAYS]);
  }
  try {
    return require.resolve(`${pkg}/bin/${exe}`);
  } catch (e) {
    fail([
      `the package ${pkg} with the binary for ${platform} is not installed.`,
      'It is an optional dependency of mcp-retry: reinstall without --omit=optional',
      '(or --no-optional), or install it by name next to mcp-retry. Other ways to install:',
      ...OTHER_WAYS,
    ]);
  }
}

function main() {
  const bin = binaryPath();
  const child = spawn(bin, process.argv.slice(2), { stdio: 'inherit', windowsHide: true });

  // A stop asked of this process goes to the binary, which ends the session
  // and exits. On Windows the binary gets the console's Ctrl-C and close
  // events itself (there are no signals to send), so this process only waits.
  const SIGNALS = ['SIGINT', 'SIGTERM', 'SIGHUP'];
  const forward = (sig) => {
    if (process.platform !== 'win32') child.kill(sig);
  };
  for (const sig of SIGNALS) process.on(sig, forward);

  // `npx mcp-retry` runs this launcher through `sh -c` and passes a signal to
  // that shell alone, which dies of it and leaves this process behind (its
  // stdin still open). So the end of the process that started this one is a
  // stop too: the binary gets SIGTERM, as if it had been passed on.
  if (process.platform !== 'win32') {
    const parent = process.ppid;
    const watch = setInterval(() => {
      if (process.ppid !== parent) {
        clearInterval(watch);
        forward('SIGTERM');
      }
    }, 200);
    watch.unref();
  }

  child.on('error', (e) => {
    fail([`cannot run ${bin}: ${e.message}`]);
  });

  child.on('exit', (code, signal) => {
    if (signal) {
      // Ended by a signal: end this process by the same one, so that whoever
      // started it sees what happened to the binary.
      for (const sig of SIGNALS) process.removeListener(sig, forward);
      process.kill(process.pid, signal);
      // A signal whose default is not to end the process: the shell's status.
      process.exit(128 + (os.constants.signals[signal] || 0));
    }
    process.exit(code);
  });
}

if (require.main === module) {
  main();
} else {
  module.exports = { binaryFor, PACKAGES };
}
