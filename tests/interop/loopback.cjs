// Preloaded (`node --require`) into an HTTP MCP server under test so that
// `listen(PORT)` binds 127.0.0.1 only: server-everything's streamableHttp
// mode takes no host and would otherwise listen on every interface.
const net = require('net');
const orig = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  if (typeof args[0] === 'number' || (typeof args[0] === 'string' && /^\d+$/.test(args[0]))) {
    const cb = args.find((a) => typeof a === 'function');
    return orig.call(this, Number(args[0]), '127.0.0.1', cb);
  }
  return orig.apply(this, args);
};
