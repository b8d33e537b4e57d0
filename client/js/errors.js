// Structured errors of the memoryd wire contract (wire-v1.md §7) plus the client's own
// failure codes. Callers branch on `err.code`, never on the message.
//
// The protocol's codes, their constants and their classes are generated from the Python
// protocol package (protocol.js); the client's own failures are declared here.
import { MemorydError, codeForRpcCode, errorClassFor, registerErrors } from './error-base.js';
import { ERROR_CLASSES, ERROR_CODES, RPC_LEVEL_CODES } from './protocol.js';

export { MemorydError, codeForRpcCode, errorClassFor };
export * from './protocol.js';

/** Failures raised by the client itself (no JSON-RPC code: `rpcCode` is null). */
export const CLIENT_CODES = Object.freeze({
  CONNECTION_CLOSED: 'CONNECTION_CLOSED',
  CONNECTION_FAILED: 'CONNECTION_FAILED',
  TIMEOUT: 'TIMEOUT',
  ABORTED: 'ABORTED',
  PROTOCOL_ERROR: 'PROTOCOL_ERROR',
});
export const { CONNECTION_CLOSED, CONNECTION_FAILED, TIMEOUT, ABORTED, PROTOCOL_ERROR } = CLIENT_CODES;

export class ConnectionClosedError extends MemorydError {}
export class ConnectionFailedError extends MemorydError {}
export class CallTimeoutError extends MemorydError {}
export class AbortedError extends MemorydError {}

registerErrors({
  ...ERROR_CLASSES,
  CONNECTION_CLOSED: ConnectionClosedError,
  CONNECTION_FAILED: ConnectionFailedError,
  TIMEOUT: CallTimeoutError,
  ABORTED: AbortedError,
}, { ...ERROR_CODES, ...RPC_LEVEL_CODES });

/** Build a client-side error of the given code. */
export function clientError(code, message, details = {}, cause) {
  const Cls = errorClassFor(code);
  return new Cls(message, { code, rpcCode: null, details, cause });
}
