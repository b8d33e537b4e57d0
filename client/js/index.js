// memoryd-client: a zero-dependency Node (>= 20) client for memoryd's JSON-RPC 2.0 wire
// contract (shared/design/wire-v1.md): NDJSON over a Unix socket or over a child's stdio.
//
// The package's public surface, gathered from its modules (none of which imports this one):
// defaults.js (constants) ← connection.js (transport) ← client.js (daemon methods)
// ← connect.js (connect, spawn). Names are listed, not `export *`, so a module's internals
// never leak into the API.

import { MemorydError } from './errors.js';
import { PROTOCOL } from './defaults.js';
import { Client, writeContext } from './client.js';
import { connect, spawn, defaultSocketPath } from './connect.js';

export * from './errors.js';
export { METHODS } from './protocol.js';
export { LineDecoder, encodeMessage } from './framing.js';
export {
  PROTOCOL,
  DEFAULT_TIMEOUT_MS,
  DEFAULT_WRITE_TIMEOUT_MS,
  ALLOWED_ONCE,
  REJECTED,
  VERSION,
  NOTIFICATIONS,
} from './defaults.js';
export { Client, writeContext } from './client.js';
export { connect, spawn, defaultSocketPath, NO_DAEMON_ERRNOS, DEFAULT_AUTOSTART_WAIT_MS, AUTOSTART_LOG } from './connect.js';

export default { connect, spawn, Client, MemorydError, defaultSocketPath, writeContext, PROTOCOL };
