// Structured errors of the memoryd wire contract (wire-v1.md §7) plus the client's own
// failure codes. Callers branch on `err.code`, never on the message.

// The protocol's error table is generated from the Python protocol package (protocol.js).
import { ERROR_CODES, RPC_LEVEL_CODES } from './protocol.js';

export { ERROR_CODES, RPC_LEVEL_CODES };

/** Failures raised by the client itself (no JSON-RPC code: `rpcCode` is null). */
export const CLIENT_CODES = Object.freeze({
  CONNECTION_CLOSED: 'CONNECTION_CLOSED',
  CONNECTION_FAILED: 'CONNECTION_FAILED',
  TIMEOUT: 'TIMEOUT',
  ABORTED: 'ABORTED',
  PROTOCOL_ERROR: 'PROTOCOL_ERROR',
});

// Every code as a string constant: `import { BUDGET_EXCEEDED } from 'memoryd-client'`.
export const INVALID_INPUT = 'INVALID_INPUT';
export const WRITE_REQUIRES_AGENT = 'WRITE_REQUIRES_AGENT';
export const BUDGET_EXCEEDED = 'BUDGET_EXCEEDED';
export const ENTRY_NOT_FOUND = 'ENTRY_NOT_FOUND';
export const AMBIGUOUS_MATCH = 'AMBIGUOUS_MATCH';
export const WRITE_DENIED = 'WRITE_DENIED';
export const PROPOSAL_NOT_FOUND = 'PROPOSAL_NOT_FOUND';
export const STORE_CORRUPT = 'STORE_CORRUPT';
export const STORE_UNSUPPORTED_VERSION = 'STORE_UNSUPPORTED_VERSION';
export const ADAPTER_NOT_FOUND = 'ADAPTER_NOT_FOUND';
export const ADAPTER_PAYLOAD = 'ADAPTER_PAYLOAD';
export const STORE_UNAVAILABLE = 'STORE_UNAVAILABLE';
export const STORE_LOCKED = 'STORE_LOCKED';
export const PARSE_ERROR = 'PARSE_ERROR';
export const INVALID_REQUEST = 'INVALID_REQUEST';
export const METHOD_NOT_FOUND = 'METHOD_NOT_FOUND';
export const INTERNAL_ERROR = 'INTERNAL_ERROR';
export const CONNECTION_CLOSED = 'CONNECTION_CLOSED';
export const CONNECTION_FAILED = 'CONNECTION_FAILED';
export const TIMEOUT = 'TIMEOUT';
export const ABORTED = 'ABORTED';
export const PROTOCOL_ERROR = 'PROTOCOL_ERROR';

const CODE_BY_RPC = new Map();
for (const [name, rpc] of Object.entries(ERROR_CODES)) CODE_BY_RPC.set(rpc, name);
for (const [name, rpc] of Object.entries(RPC_LEVEL_CODES)) CODE_BY_RPC.set(rpc, name);

/** The protocol code name for a JSON-RPC error code (`-32011` → `BUDGET_EXCEEDED`), else `RPC_ERROR`. */
export function codeForRpcCode(rpcCode) {
  return CODE_BY_RPC.get(rpcCode) ?? 'RPC_ERROR';
}

/** Base class of every error the client rejects with. */
export class MemorydError extends Error {
  /**
   * @param {string} message
   * @param {{code?: string, rpcCode?: number|null, details?: object, data?: unknown, cause?: unknown}} [opts]
   */
  constructor(message, { code = 'RPC_ERROR', rpcCode = null, details = {}, data, cause } = {}) {
    super(message, cause === undefined ? undefined : { cause });
    this.name = new.target.name;
    /** Protocol code: `error.data.code`, or derived from the JSON-RPC code, or a client code. */
    this.code = code;
    /** JSON-RPC numeric error code (null for client-side failures). */
    this.rpcCode = rpcCode;
    /** `error.data.details`, or `{}`. */
    this.details = details && typeof details === 'object' ? details : {};
    /** The raw `error.data` object, when there was one. */
    if (data !== undefined) this.data = data;
  }

  /** Rebuild the typed error from a JSON-RPC `error` object. */
  static fromWire(error) {
    if (!error || typeof error !== 'object') {
      return new MemorydError('malformed error object', { code: INTERNAL_ERROR, rpcCode: RPC_LEVEL_CODES.INTERNAL_ERROR });
    }
    const rpcCode = Number.isInteger(error.code) ? error.code : RPC_LEVEL_CODES.INTERNAL_ERROR;
    const data = error.data && typeof error.data === 'object' && !Array.isArray(error.data) ? error.data : undefined;
    const code = typeof data?.code === 'string' && data.code ? data.code : codeForRpcCode(rpcCode);
    const details = data?.details && typeof data.details === 'object' && !Array.isArray(data.details) ? data.details : {};
    const message = typeof error.message === 'string' ? error.message : String(data?.message ?? code);
    const Cls = CLASS_BY_CODE.get(code) ?? MemorydError;
    return new Cls(message, { code, rpcCode, details, data: error.data });
  }
}

export class InvalidInputError extends MemorydError {}
export class WriteRequiresAgentError extends MemorydError {}
export class BudgetExceededError extends MemorydError {}
export class EntryNotFoundError extends MemorydError {}
export class AmbiguousMatchError extends MemorydError {}
export class WriteDeniedError extends MemorydError {}
export class ProposalNotFoundError extends MemorydError {}
export class StoreCorruptError extends MemorydError {}
export class StoreUnsupportedVersionError extends MemorydError {}
export class AdapterNotFoundError extends MemorydError {}
export class AdapterPayloadError extends MemorydError {}
export class StoreUnavailableError extends MemorydError {}
export class StoreLockedError extends MemorydError {}
export class ParseError extends MemorydError {}
export class InvalidRequestError extends MemorydError {}
export class MethodNotFoundError extends MemorydError {}
export class InternalError extends MemorydError {}
export class ConnectionClosedError extends MemorydError {}
export class ConnectionFailedError extends MemorydError {}
export class CallTimeoutError extends MemorydError {}
export class AbortedError extends MemorydError {}

const CLASS_BY_CODE = new Map([
  [INVALID_INPUT, InvalidInputError],
  [WRITE_REQUIRES_AGENT, WriteRequiresAgentError],
  [BUDGET_EXCEEDED, BudgetExceededError],
  [ENTRY_NOT_FOUND, EntryNotFoundError],
  [AMBIGUOUS_MATCH, AmbiguousMatchError],
  [WRITE_DENIED, WriteDeniedError],
  [PROPOSAL_NOT_FOUND, ProposalNotFoundError],
  [STORE_CORRUPT, StoreCorruptError],
  [STORE_UNSUPPORTED_VERSION, StoreUnsupportedVersionError],
  [ADAPTER_NOT_FOUND, AdapterNotFoundError],
  [ADAPTER_PAYLOAD, AdapterPayloadError],
  [STORE_UNAVAILABLE, StoreUnavailableError],
  [STORE_LOCKED, StoreLockedError],
  [PARSE_ERROR, ParseError],
  [INVALID_REQUEST, InvalidRequestError],
  [METHOD_NOT_FOUND, MethodNotFoundError],
  [INTERNAL_ERROR, InternalError],
  [CONNECTION_CLOSED, ConnectionClosedError],
  [CONNECTION_FAILED, ConnectionFailedError],
  [TIMEOUT, CallTimeoutError],
  [ABORTED, AbortedError],
]);

/** The subclass used for a code (MemorydError for unknown codes). */
export function errorClassFor(code) {
  return CLASS_BY_CODE.get(code) ?? MemorydError;
}

/** Build a client-side error of the given code. */
export function clientError(code, message, details = {}, cause) {
  const Cls = errorClassFor(code);
  return new Cls(message, { code, rpcCode: null, details, cause });
}
