// The connection machinery under Client: the JSON-RPC request/response loop over a
// readable/writable pair, notifications, approval handling and shutdown. Client (client.js)
// extends it with one method per daemon method; this module knows none of them.

import { EventEmitter } from 'node:events';

import { LineDecoder, encodeMessage } from './framing.js';
import {
  MemorydError,
  clientError,
  CONNECTION_CLOSED,
  PROTOCOL_ERROR,
  INVALID_INPUT,
  INVALID_REQUEST,
  TIMEOUT,
  ABORTED,
} from './errors.js';
import { ALLOWED_ONCE, REJECTED, CLIENT_NAME, CLIENT_VERSION, DEFAULT_TIMEOUT_MS, DEFAULT_WRITE_TIMEOUT_MS } from './defaults.js';

function normalizeOutcome(value) {
  if (isDecision(value)) return normalizeOutcome(value.outcome);
  if (value === true) return ALLOWED_ONCE;
  if (typeof value === 'string' && value !== '') return value;
  return REJECTED;
}

/** `{outcome, by?}`: an outcome with the client's claim of who decided (`by: {kind, name?}`). */
export function isDecision(value) {
  return typeof value === 'object' && value !== null && 'outcome' in value;
}

/** `approval/decided` params for an outcome or an `{outcome, by}` decision. */
export function decidedParams(id, decision) {
  const params = { id, outcome: normalizeOutcome(decision) };
  if (isDecision(decision) && decision.by !== undefined && decision.by !== null) params.by = decision.by;
  return params;
}

export function isTimeout(ms) {
  return typeof ms === 'number' && Number.isFinite(ms) && ms > 0;
}

/** A connection to memoryd without the daemon methods: see Client (client.js). */
export class Connection extends EventEmitter {
  constructor({
    readable,
    writable = readable,
    session,
    write,
    capabilities,
    clientInfo,
    timeoutMs = DEFAULT_TIMEOUT_MS,
    writeTimeoutMs = DEFAULT_WRITE_TIMEOUT_MS,
    onApproval,
    onEvent,
    maxMessageBytes = Infinity,
    shutdown,
    destroyTransport,
  } = {}) {
    super();
    if (!readable || !writable) throw new TypeError('Client needs a readable and a writable stream');
    /** The session used for the default write context, snapshots and proposals. */
    this.session = session;
    this._write = write;
    this.capabilities = { approvals: true, ...(capabilities ?? {}) };
    this.clientInfo = { name: CLIENT_NAME, version: CLIENT_VERSION, ...(clientInfo ?? {}) };
    this.timeoutMs = timeoutMs;
    this.writeTimeoutMs = writeTimeoutMs;
    /** The `initialize` result once initialized. */
    this.serverInfo = undefined;
    this.closed = false;
    /** Why the connection closed (a MemorydError with code CONNECTION_CLOSED). */
    this.closeReason = undefined;
    this._approvalHandler = onApproval;
    this._onEvent = onEvent;
    this._readable = readable;
    this._writable = writable;
    this._pending = new Map();
    /** Approval handlers of this connection still deciding; while > 0 call clocks stand still. */
    this._deciding = 0;
    this._approvals = new Map();
    this._nextId = 1;
    this._closePromise = undefined;
    this._shutdown = shutdown;
    this._destroyTransport = destroyTransport;
    this._decoder = new LineDecoder({
      maxLineBytes: maxMessageBytes,
      onOverflow: () => this._emitError(clientError(PROTOCOL_ERROR, `message longer than ${maxMessageBytes} bytes discarded`)),
    });

    readable.on('data', (chunk) => this._onData(chunk));
    readable.on('end', () => this._onEnd());
    readable.on('close', () => this._onEnd());
    readable.on('error', (err) => this._onTransportError(err));
    this._outputGone = undefined;
    if (writable !== readable) {
      // A separate output stream (a child's stdin) that fails or closes makes further sends
      // fail at once; calls already sent still wait for the input side, which carries any
      // last responses and ends when the peer exits.
      writable.on('error', (err) => {
        this._outputGone ??= err;
      });
      writable.on('close', () => {
        this._outputGone ??= new Error('output stream closed');
      });
    }
  }

  // --- configuration --------------------------------------------------------------------

  /** Install (or remove, with undefined) the approval handler. */
  setApprovalHandler(handler) {
    this._approvalHandler = handler;
    return this;
  }

  get approvalHandler() {
    return this._approvalHandler;
  }

  /** Number of calls awaiting a response. */
  get pendingCount() {
    return this._pending.size;
  }

  // --- generic JSON-RPC -----------------------------------------------------------------

  /**
   * Send a request and resolve with its result; rejects with a MemorydError.
   * `params` defaults to `{}`. Options: `timeoutMs` (0 or Infinity = none), `signal`.
   */
  call(method, params, { timeoutMs, signal } = {}) {
    return new Promise((resolve, reject) => {
      if (this.closed) {
        reject(clientError(CONNECTION_CLOSED, `cannot call ${method}: connection closed`, { method }, this.closeReason));
        return;
      }
      if (params !== undefined && params !== null && typeof params !== 'object') {
        // JSON-RPC 2.0 §4.2: params is structured (object or array) or absent.
        reject(clientError(INVALID_REQUEST, `${method}: params must be an object or an array`, { method }));
        return;
      }
      if (signal?.aborted) {
        reject(clientError(ABORTED, `${method} aborted`, { method }, signal.reason));
        return;
      }
      const id = this._nextId++;
      const ms = timeoutMs ?? this.timeoutMs;
      const entry = { method, params: params ?? {}, resolve, reject, timer: undefined, signal, onAbort: undefined, fire: undefined, deadline: 0, remaining: undefined };
      if (isTimeout(ms)) {
        entry.fire = () => {
          this._settle(id, undefined, clientError(TIMEOUT, `${method} timed out after ${ms} ms`, { method, timeoutMs: ms }));
        };
        if (this._deciding > 0) entry.remaining = ms; // clocks are paused while a human decides
        else {
          entry.deadline = Date.now() + ms;
          entry.timer = setTimeout(entry.fire, ms);
        }
      }
      if (signal) {
        entry.onAbort = () => this._settle(id, undefined, clientError(ABORTED, `${method} aborted`, { method }, signal.reason));
        signal.addEventListener('abort', entry.onAbort, { once: true });
      }
      this._pending.set(id, entry);
      try {
        this._send({ jsonrpc: '2.0', id, method, params: params ?? {} });
      } catch (err) {
        this._settle(id, undefined, err instanceof MemorydError ? err : clientError(CONNECTION_CLOSED, `cannot send ${method}: ${err.message}`, { method }, err));
      }
    });
  }

  /** Send a notification (no id, no response). Throws CONNECTION_CLOSED when closed. */
  notify(method, params) {
    const msg = { jsonrpc: '2.0', method };
    if (params !== undefined) msg.params = params;
    this._send(msg);
  }

  // --- lifecycle ------------------------------------------------------------------------

  /**
   * Close the connection: every pending call is rejected with CONNECTION_CLOSED, then the
   * transport is shut down (socket ended; a spawned daemon's stdin ended and its exit awaited,
   * resolving to `{code, signal}`). Idempotent.
   */
  close() {
    if (!this._closePromise) {
      this._markClosed(clientError(CONNECTION_CLOSED, 'connection closed by client'));
      this._closePromise = Promise.resolve()
        .then(() => (this._shutdown ? this._shutdown() : defaultShutdown(this._readable, this._writable)))
        .catch((err) => {
          this._emitError(err);
          return undefined;
        });
    }
    return this._closePromise;
  }

  /** Tear the connection down at once (no graceful end). */
  destroy() {
    this._markClosed(clientError(CONNECTION_CLOSED, 'connection destroyed by client'));
    if (this._destroyTransport) this._destroyTransport();
    else {
      this._readable.destroy?.();
      if (this._writable !== this._readable) this._writable.destroy?.();
    }
  }

  // --- internals ------------------------------------------------------------------------

  _send(message) {
    if (this.closed) throw clientError(CONNECTION_CLOSED, 'connection closed', {}, this.closeReason);
    if (this._outputGone) {
      throw clientError(CONNECTION_CLOSED, `connection closed: ${this._outputGone.message}`, { errno: this._outputGone.code }, this._outputGone);
    }
    this._writable.write(encodeMessage(message));
  }

  _settle(id, result, error) {
    const entry = this._pending.get(id);
    if (!entry) return;
    this._pending.delete(id);
    if (entry.timer) clearTimeout(entry.timer);
    if (entry.onAbort) entry.signal.removeEventListener('abort', entry.onAbort);
    if (error) entry.reject(error);
    else entry.resolve(result);
  }

  _onData(chunk) {
    if (this.closed) return;
    let lines;
    try {
      lines = this._decoder.push(chunk);
    } catch (err) {
      this._emitError(err);
      return;
    }
    for (const line of lines) this._onLine(line);
  }

  _onEnd() {
    if (this.closed) return;
    for (const line of this._decoder.end()) this._onLine(line);
    this._markClosed(clientError(CONNECTION_CLOSED, 'connection closed by daemon'));
  }

  _onTransportError(err) {
    if (this.closed) return;
    this._markClosed(clientError(CONNECTION_CLOSED, `connection lost: ${err.message}`, { errno: err.code }, err));
  }

  _onLine(line) {
    let msg;
    try {
      msg = JSON.parse(line);
    } catch (err) {
      this._emitError(clientError(PROTOCOL_ERROR, `invalid JSON from daemon: ${err.message}`, { line: line.slice(0, 200) }, err));
      return;
    }
    if (Array.isArray(msg)) for (const m of msg) this._onMessage(m);
    else this._onMessage(msg);
  }

  _onMessage(msg) {
    if (!msg || typeof msg !== 'object') {
      this._emitError(clientError(PROTOCOL_ERROR, 'non-object message from daemon'));
      return;
    }
    const hasId = Object.hasOwn(msg, 'id') && msg.id !== undefined;
    if (typeof msg.method === 'string') {
      if (!hasId || msg.id === null) this._onNotification(msg.method, msg.params);
      else this._onServerRequest(msg);
      return;
    }
    if (Object.hasOwn(msg, 'result') || Object.hasOwn(msg, 'error')) {
      if (msg.id === null || !this._pending.has(msg.id)) {
        // An error we cannot route (id null: the daemon could not read our line) or a late
        // response to a call that already timed out / was aborted.
        if (Object.hasOwn(msg, 'error')) this._emitError(MemorydError.fromWire(msg.error));
        return;
      }
      if (Object.hasOwn(msg, 'error')) this._settle(msg.id, undefined, MemorydError.fromWire(msg.error));
      else this._settle(msg.id, msg.result);
      return;
    }
    this._emitError(clientError(PROTOCOL_ERROR, 'unrecognized message from daemon', { message: msg }));
  }

  _onServerRequest(msg) {
    // The contract has no daemon → client requests; answer politely so nothing hangs.
    const message = `method not found: ${msg.method}`;
    try {
      this._send({
        jsonrpc: '2.0',
        id: msg.id,
        error: { code: -32601, message, data: { code: 'METHOD_NOT_FOUND', message, details: {} } },
      });
    } catch {
      /* closed */
    }
  }

  _onNotification(method, params) {
    this._safeEmit(method, params);
    this._safeEmit('notification', method, params);
    if (this._onEvent) {
      try {
        this._onEvent(method, params);
      } catch (err) {
        this._emitError(err);
      }
    }
    if (method === 'approval/asked') this._onApprovalAsked(params);
    else if (method === 'approval/resolved') this._onApprovalResolved(params);
  }

  _pauseClocks() {
    if (this._deciding++ > 0) return;
    const now = Date.now();
    for (const entry of this._pending.values()) {
      if (entry.timer !== undefined) {
        clearTimeout(entry.timer);
        entry.timer = undefined;
        entry.remaining = Math.max(0, entry.deadline - now);
      }
    }
  }

  _resumeClocks() {
    if (--this._deciding > 0) return;
    for (const entry of this._pending.values()) {
      if (entry.remaining !== undefined && entry.fire) {
        entry.deadline = Date.now() + entry.remaining;
        entry.timer = setTimeout(entry.fire, entry.remaining);
        entry.remaining = undefined;
      }
    }
  }

  _onApprovalResolved(params) {
    const state = params && this._approvals.get(params.id);
    if (state) {
      state.resolved = true;
      state.controller.abort(Object.assign(new Error(`approval ${params.id} resolved elsewhere: ${params.outcome}`), { outcome: params.outcome }));
    }
  }

  /** The in-flight call an `approval/asked` names by its `requestId`: `{requestId, method, params}`. */
  _askingCall(payload) {
    const requestId = payload?.requestId;
    if (requestId === undefined || requestId === null) return {};
    const entry = this._pending.get(requestId);
    return entry ? { requestId, method: entry.method, params: entry.params } : {};
  }

  async _onApprovalAsked(payload) {
    const id = payload?.id;
    if (typeof id !== 'string' || this._approvals.has(id)) return;
    const call = this._askingCall(payload); // before any await: the call is in flight now
    const state = { controller: new AbortController(), resolved: false };
    this._approvals.set(id, state);
    let decision = REJECTED;
    // Time at this connection's own prompt does not count against the write that asked:
    // otherwise the caller would see TIMEOUT while the human's later "yes" still commits.
    this._pauseClocks();
    try {
      const handler = this._approvalHandler;
      if (typeof handler === 'function') {
        decision = await handler(payload, { ...call, signal: state.controller.signal, client: this });
      }
    } catch (err) {
      decision = REJECTED;
      if (!state.resolved && !this.closed) this._emitError(err);
    } finally {
      this._approvals.delete(id);
      this._resumeClocks();
    }
    if (state.resolved || this.closed) return; // moot: someone else decided, or we are gone
    try {
      await this.call('approval/decided', decidedParams(id, decision));
    } catch (err) {
      // Another approver won the race, the daemon timed the approval out, or we closed:
      // the daemon refuses a late decision (INVALID_INPUT) and nothing changes.
      if (state.resolved || err.code === INVALID_INPUT || err.code === CONNECTION_CLOSED) return;
      this._emitError(err);
    }
  }

  _markClosed(reason) {
    if (this.closed) return;
    this.closed = true;
    this.closeReason = reason;
    for (const id of [...this._pending.keys()]) {
      const entry = this._pending.get(id);
      this._settle(id, undefined, clientError(CONNECTION_CLOSED, `${entry.method}: ${reason.message}`, { method: entry.method }, reason.cause));
    }
    for (const state of this._approvals.values()) state.controller.abort(reason);
    this._safeEmit('close', reason);
  }

  _safeEmit(event, ...args) {
    try {
      this.emit(event, ...args);
    } catch (err) {
      if (event !== 'error') this._emitError(err);
    }
  }

  _emitError(err) {
    if (this.listenerCount('error') > 0) this._safeEmit('error', err);
  }
}

// `await using client = await connect(...)` where the runtime has Symbol.asyncDispose.
if (typeof Symbol.asyncDispose === 'symbol') {
  Object.defineProperty(Connection.prototype, Symbol.asyncDispose, {
    value: async function asyncDispose() {
      await this.close();
    },
    writable: true,
    configurable: true,
  });
}

function defaultShutdown(readable, writable) {
  if (readable !== writable) {
    // A separate stream pair: end our side; the reader is ignored from now on.
    return new Promise((resolve) => {
      if (writable.writableFinished || writable.destroyed) return resolve(undefined);
      const timer = setTimeout(() => resolve(undefined), 2000);
      writable.once('finish', () => {
        clearTimeout(timer);
        resolve(undefined);
      });
      try {
        writable.end();
      } catch {
        clearTimeout(timer);
        resolve(undefined);
      }
    });
  }
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      resolve(undefined);
    };
    if (readable.destroyed || readable.closed) return resolve(undefined);
    readable.once('close', done);
    const timer = setTimeout(() => {
      readable.destroy();
      if (writable !== readable) writable.destroy?.();
    }, 2000);
    try {
      writable.end();
    } catch {
      readable.destroy();
    }
  });
}
