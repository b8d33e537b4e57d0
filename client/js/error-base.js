// The base class of every error the client rejects with. Its subclasses are generated from
// the protocol's error table (protocol.js) and declared for the client's own failures
// (errors.js), which registers them here for `fromWire`.

const CLASS_BY_CODE = new Map();
const CODE_BY_RPC = new Map();

/** Make `fromWire` know every code: `classes` code → class, `rpcCodes` code → JSON-RPC code. */
export function registerErrors(classes, rpcCodes) {
  for (const [code, cls] of Object.entries(classes)) CLASS_BY_CODE.set(code, cls);
  for (const [code, rpc] of Object.entries(rpcCodes)) CODE_BY_RPC.set(rpc, code);
}

/** The protocol code name for a JSON-RPC error code (`-32011` → `BUDGET_EXCEEDED`), else `RPC_ERROR`. */
export function codeForRpcCode(rpcCode) {
  return CODE_BY_RPC.get(rpcCode) ?? 'RPC_ERROR';
}

/** The subclass used for a code (MemorydError for unknown codes). */
export function errorClassFor(code) {
  return CLASS_BY_CODE.get(code) ?? MemorydError;
}

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
      return new (errorClassFor('INTERNAL_ERROR'))('malformed error object', { code: 'INTERNAL_ERROR', rpcCode: -32603 });
    }
    const rpcCode = Number.isInteger(error.code) ? error.code : -32603;
    const data = error.data && typeof error.data === 'object' && !Array.isArray(error.data) ? error.data : undefined;
    const code = typeof data?.code === 'string' && data.code ? data.code : codeForRpcCode(rpcCode);
    const details = data?.details && typeof data.details === 'object' && !Array.isArray(data.details) ? data.details : {};
    const message = typeof error.message === 'string' ? error.message : String(data?.message ?? code);
    const Cls = errorClassFor(code);
    return new Cls(message, { code, rpcCode, details, data: error.data });
  }
}
