// memoryd-client: a zero-dependency Node (>= 20) client for memoryd's JSON-RPC 2.0 wire
// contract (shared/design/wire-v1.md): NDJSON over a Unix socket or over a child's stdio.

import { EventEmitter } from 'node:events';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import childProcess from 'node:child_process';

import { LineDecoder, encodeMessage } from './framing.js';
import {
  MemorydError,
  clientError,
  CONNECTION_CLOSED,
  CONNECTION_FAILED,
  TIMEOUT,
  ABORTED,
  PROTOCOL_ERROR,
  INVALID_INPUT,
  INVALID_REQUEST,
} from './errors.js';

export * from './errors.js';
export { METHODS } from './protocol.js';
export { LineDecoder, encodeMessage } from './framing.js';

/** The protocol identifier sent in `initialize`. */
export const PROTOCOL = 'dsh-memory-protocol/v1';
/** Default per-call timeout (reads, approval decisions, initialize). */
export const DEFAULT_TIMEOUT_MS = 30_000;
/**
 * Default timeout for write calls (add/replace/remove/consolidate/seed/import/proposalsApprove).
 * A write under write policy `ask` waits for a human; the daemon itself denies an unanswered
 * approval as `cancelled` after `approval_timeout_s` (default 300 s), so the client waits a
 * little longer than that and normally sees the daemon's WRITE_DENIED rather than a TIMEOUT.
 */
export const DEFAULT_WRITE_TIMEOUT_MS = 330_000;
/** The only approval outcome that lets a write through. */
export const ALLOWED_ONCE = 'allowed-once';
/** The outcome the client sends when it cannot or will not approve (fail closed). */
export const REJECTED = 'rejected';

const CLIENT_NAME = 'memoryd-client';
const CLIENT_VERSION = '0.1.0';
export const VERSION = CLIENT_VERSION;

/** Notification methods the daemon sends (wire-v1.md §5, §6). */
export const NOTIFICATIONS = Object.freeze([
  'approval/asked',
  'approval/resolved',
  'memory/added',
  'memory/updated',
  'memory/removed',
  'memory/recalled',
  'memory/snapshot',
]);

/**
 * Default daemon socket: `$MEMORYD_SOCKET` when set, else `$XDG_RUNTIME_DIR/memoryd/memoryd.sock`,
 * else `<os.tmpdir()>/memoryd-<uid>/memoryd.sock` (the daemon's and memoryctl's rule, wire-v1.md §2).
 */
export function defaultSocketPath(env = process.env) {
  if (env.MEMORYD_SOCKET) return env.MEMORYD_SOCKET;
  const xdg = env.XDG_RUNTIME_DIR;
  if (xdg) return path.join(xdg, 'memoryd', 'memoryd.sock');
  const uid = typeof process.getuid === 'function' ? process.getuid() : os.userInfo().uid;
  return path.join(os.tmpdir(), `memoryd-${uid}`, 'memoryd.sock');
}

/** The write context for a session: `{agent: {session}}` (wire-v1.md §3). */
export function writeContext(session) {
  return { agent: { session } };
}

function normalizeOutcome(value) {
  if (isDecision(value)) return normalizeOutcome(value.outcome);
  if (value === true) return ALLOWED_ONCE;
  if (typeof value === 'string' && value !== '') return value;
  return REJECTED;
}

/** `{outcome, by?}`: an outcome with the client's claim of who decided (`by: {kind, name?}`). */
function isDecision(value) {
  return typeof value === 'object' && value !== null && 'outcome' in value;
}

/** `approval/decided` params for an outcome or an `{outcome, by}` decision. */
function decidedParams(id, decision) {
  const params = { id, outcome: normalizeOutcome(decision) };
  if (isDecision(decision) && decision.by !== undefined && decision.by !== null) params.by = decision.by;
  return params;
}

function isTimeout(ms) {
  return typeof ms === 'number' && Number.isFinite(ms) && ms > 0;
}

/**
 * One connection to memoryd. Create it with `connect()` or `spawn()`; `new Client()` wraps
 * an already-open readable/writable pair (no `initialize` is sent).
 *
 * Events: every daemon notification under its method name (`memory/added`, `memory/updated`,
 * `memory/removed`, `memory/recalled`, `memory/snapshot`, `approval/asked`,
 * `approval/resolved`) with its params; `notification` (method, params) for all of them;
 * `close` (reason: MemorydError) once; `error` (err) for problems not tied to a call
 * (only emitted when an `error` listener is registered, so an unhandled one never crashes
 * the process); `stderr` (chunk) for a spawned daemon with `stderr: 'pipe'`.
 */
export class Client extends EventEmitter {
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

  /** The write context sent with write methods unless one is passed explicitly. */
  get writeContext() {
    if (this._write !== undefined) return this._write;
    return this.session ? writeContext(this.session) : undefined;
  }

  set writeContext(value) {
    this._write = value;
  }

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

  // --- daemon methods (wire-v1.md §4) ----------------------------------------------------

  /**
   * `initialize`. `connect()`/`spawn()` call it for you with
   * `{protocol, client: clientInfo, capabilities}`; fields in `params` override those.
   * The result is kept as `client.serverInfo`.
   */
  async initialize(params = {}, call) {
    const full = {
      protocol: PROTOCOL,
      client: this.clientInfo,
      capabilities: this.capabilities,
      ...params,
    };
    const result = await this.call('initialize', full, call);
    this.serverInfo = result;
    return result;
  }

  /** `memory/add` → `{entry, usage}`. */
  add(input, opts) {
    return this._writeCall('memory/add', { input }, opts);
  }

  /** `memory/replace` (`{track, scope, match, text, tags?}`) → `{previous, entry, usage}`. */
  replace(input, opts) {
    return this._writeCall('memory/replace', { input }, opts);
  }

  /** `memory/remove` (`{track, scope, match}`) → `{entry, usage}`. */
  remove(input, opts) {
    return this._writeCall('memory/remove', { input }, opts);
  }

  /** `memory/consolidate` (`{track, scope, matches, text, tags?}`) → `{removed, entry, usage}`. */
  consolidate(input, opts) {
    return this._writeCall('memory/consolidate', { input }, opts);
  }

  /** `memory/seed` (array of EntryInput, one approval) → `{added, entries}`. */
  seed(inputs, opts) {
    return this._writeCall('memory/seed', { inputs }, opts);
  }

  /**
   * The `opts` that `query()` sends when the call passes none: the connection's session's
   * visible set, `{sessionId?, agentKey: header.agentPreset ?? '', workspaceKey: header.cwd ?? ''}`
   * (`sessionId` only when the session has an id: the daemon then audits the recall and sends
   * `memory/recalled`). `undefined` without a session: the whole store.
   */
  get queryOpts() {
    const session = this.session;
    if (!session || typeof session !== 'object') return undefined;
    const header = session.header && typeof session.header === 'object' ? session.header : {};
    const opts = {};
    if (session.id !== undefined && session.id !== null) opts.sessionId = session.id;
    opts.agentKey = header.agentPreset ?? '';
    opts.workspaceKey = header.cwd ?? '';
    return opts;
  }

  /**
   * `memory/query` → `{entries, total, truncated}`. `opts` is the wire `opts` (`sessionId`,
   * `agentKey`, `workspaceKey`); left out (`undefined`), it is `client.queryOpts`: a client with
   * a session sees that session's visible set. `null` (or `{}`) asks for the whole store.
   */
  query(filter, opts, call) {
    const params = {};
    if (filter !== undefined) params.filter = filter;
    const o = opts === undefined ? this.queryOpts : opts;
    if (o !== undefined) params.opts = o;
    return this.call('memory/query', params, call);
  }

  /** `memory/budgets` → four BudgetRows. */
  budgets(call) {
    return this.call('memory/budgets', {}, call);
  }

  /** `memory/list` → every Entry, creation order. */
  list(call) {
    return this.call('memory/list', {}, call);
  }

  /** `audit/list` (`{limit?}`, default 100) → AuditRows, newest first. */
  auditList(params = {}, call) {
    return this.call('audit/list', params ?? {}, call);
  }

  /**
   * `audit/verify` → LedgerReport: the daemon checks the ledger's hash chain, that every audit
   * row since the chain's start is in it unchanged, and that replaying it gives the live
   * entries. `ok` false names the breaks in `problems`, the first one first.
   */
  auditVerify(call) {
    return this.call('audit/verify', {}, call);
  }

  /**
   * `audit/explain` (`{target}`) → EntryLife: one entry's life. `target` is the entry's id, or
   * a text that exactly one entry contains (case-insensitive); none or several:
   * INVALID_INPUT with `details.field` 'target'.
   */
  auditExplain(target, call) {
    return this.call('audit/explain', { target }, call);
  }

  /** `memory/snapshot` → `{text}`. `session` defaults to the connection's session. */
  snapshot(session = this.session, params = {}, call) {
    return this.call('memory/snapshot', { ...(params ?? {}), session }, call);
  }

  /** `memory/export` (`{adapter?}`) → the export envelope, or the adapter's document. */
  export(params = {}, call) {
    return this.call('memory/export', params ?? {}, call);
  }

  /**
   * `memory/import` (`{envelope}` or `{adapter, payload}`, plus `skipExisting?`) →
   * `{added, entries, skipped?}`. `skipExisting: true` leaves out entries whose track, scope,
   * workspaceKey, agentKey and text already exist.
   */
  import(params, opts) {
    const { write, ...rest } = params ?? {};
    const o = write !== undefined && (opts?.write === undefined) ? { ...(opts ?? {}), write } : opts;
    return this._writeCall('memory/import', rest, o);
  }

  /** `adapters/list` → AdapterInfo[]. */
  adaptersList(call) {
    return this.call('adapters/list', {}, call);
  }

  /** `proposals/create` → the pending Proposal, or null. `session` defaults to the connection's. */
  proposalsCreate(input, session = this.session, call) {
    return this.call('proposals/create', { input, session }, call);
  }

  /** `proposals/list` (`{status?}`) → Proposal[]. */
  proposalsList(params = {}, call) {
    return this.call('proposals/list', params ?? {}, call);
  }

  /** `proposals/approve` → `{proposal, entry, usage}` (rides the write pipeline). */
  proposalsApprove(id, opts) {
    return this._writeCall('proposals/approve', { id }, opts);
  }

  /** `proposals/dismiss` → the dismissed Proposal. */
  proposalsDismiss(id, call) {
    return this.call('proposals/dismiss', { id }, call);
  }

  /**
   * `approval/decided` → `{}`. Decide an approval by hand (the onApproval handler does it for
   * you). `outcome` is an outcome string, or `{outcome, by}` where `by: {kind: 'human'|'policy'|'script',
   * name?}` claims who decided (the daemon keeps it with the decision).
   */
  approvalDecided(id, outcome, call) {
    return this.call('approval/decided', isDecision(outcome) ? decidedParams(id, outcome) : { id, outcome }, call);
  }

  /** `approval/subscribe` → `{}`: this connection becomes an approver for headless writers. */
  approvalSubscribe(call) {
    return this.call('approval/subscribe', {}, call);
  }

  /**
   * `memory/watch` → `{}`: from now on this connection also gets `memory/added`,
   * `memory/updated` and `memory/removed` for other connections' writes of the entries
   * `session` (default: the connection's) sees, each with the writer's `sessionId`. They
   * arrive as every event does: `on('memory/added', …)`, `notification`, `onEvent`.
   */
  watch(session = this.session, call) {
    return this.call('memory/watch', { session }, call);
  }

  /** `daemon/status` → `{version, uptimeS, connections, pendingApprovals, queueDepth, store, …, connectionList}`. */
  status(call) {
    return this.call('daemon/status', {}, call);
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

  _writeCall(method, params, opts = {}) {
    const { write, session, timeoutMs, signal } = opts ?? {};
    let ctx;
    if (write !== undefined) ctx = write;
    else if (session !== undefined) ctx = session === null ? null : writeContext(session);
    else ctx = this.writeContext;
    const full = { ...params };
    if (ctx !== undefined) full.write = ctx;
    return this.call(method, full, { timeoutMs: timeoutMs ?? this.writeTimeoutMs, signal });
  }

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
  Object.defineProperty(Client.prototype, Symbol.asyncDispose, {
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

/** errno codes of a connect that mean "no daemon there (yet)", as opposed to, say, EACCES. */
export const NO_DAEMON_ERRNOS = Object.freeze(['ENOENT', 'ECONNREFUSED']);
/** How long `connect({autostart: true})` waits for the daemon it started, unless `wait` says. */
export const DEFAULT_AUTOSTART_WAIT_MS = 10_000;
/** The daemon's stderr goes here, next to the socket (as memoryctl's autostart does). */
export const AUTOSTART_LOG = 'memoryd.log';
const MAX_TIMER_MS = 2 ** 31 - 1;

/** One connect attempt; rejects with the raw socket error (its `code`, e.g. ENOENT). */
function connectOnce(socketPath, timeoutMs) {
  return new Promise((resolve, reject) => {
    const s = net.createConnection({ path: socketPath });
    let timer;
    const fail = (err) => {
      clearTimeout(timer);
      s.destroy();
      reject(err);
    };
    s.once('error', fail);
    if (isTimeout(timeoutMs)) timer = setTimeout(() => fail(Object.assign(new Error('connect timed out'), { code: 'ETIMEDOUT' })), timeoutMs);
    s.once('connect', () => {
      clearTimeout(timer);
      s.off('error', fail);
      resolve(s);
    });
  });
}

/**
 * A one-shot wake-up for the next change on the way to `socketPath`: an `fs.watch` on the
 * socket's directory, or on its nearest existing ancestor while that directory does not exist
 * yet. The daemon moves its socket into place once it listens, so that directory sees an event
 * exactly when a connection can succeed. Where nothing can be watched, a backoff stands in.
 */
function watchForSocket(socketPath, attempt) {
  let dir = path.dirname(socketPath);
  for (;;) {
    try {
      if (fs.statSync(dir).isDirectory()) break;
    } catch {
      /* missing: look further up */
    }
    const up = path.dirname(dir);
    if (up === dir) break;
    dir = up;
  }
  let wake;
  const changed = new Promise((resolve) => {
    wake = resolve;
  });
  let watcher;
  let timer;
  try {
    watcher = fs.watch(dir, { persistent: false }, () => wake());
    watcher.on('error', () => wake());
  } catch {
    timer = setTimeout(wake, Math.min(10 * 2 ** attempt, 250)); // e.g. inotify limits reached
  }
  return {
    changed,
    close() {
      watcher?.close();
      clearTimeout(timer);
    },
  };
}

/**
 * Connect to `socketPath`, retrying ENOENT/ECONNREFUSED until `deadline` (epoch ms): each
 * retry waits for a change in the socket's directory (or `stop`), never a fixed sleep.
 * Rejects with the last socket error (`err.code`); `timedOut` is set when the deadline passed.
 */
async function connectWaiting(socketPath, { deadline, connectTimeoutMs, stop }) {
  for (let attempt = 0; ; attempt++) {
    const watch = watchForSocket(socketPath, attempt); // armed before the attempt: nothing is missed
    try {
      return await connectOnce(socketPath, connectTimeoutMs);
    } catch (err) {
      if (!NO_DAEMON_ERRNOS.includes(err.code)) throw err;
      const left = deadline - Date.now();
      if (left <= 0) throw Object.assign(err, { timedOut: true });
      let timer;
      const expired = new Promise((resolve) => {
        timer = setTimeout(resolve, Math.min(left, MAX_TIMER_MS)); // a longer wait loops
      });
      const woke = await Promise.race([watch.changed, expired, stop ?? new Promise(() => {})].map((p, i) => p.then(() => i)));
      clearTimeout(timer);
      // `stop`: the daemon we started has exited. One last attempt: another one may have won.
      if (woke === 2) return await connectOnce(socketPath, connectTimeoutMs);
    } finally {
      watch.close();
    }
  }
}

function connectFailed(socketPath, err, extra = {}) {
  const waited = err.timedOut && extra.waitMs > 0 ? ` (waited ${extra.waitMs} ms)` : '';
  return clientError(
    CONNECTION_FAILED,
    `cannot connect to memoryd at ${socketPath}: ${err.message}${waited}`,
    { socketPath, errno: err.code, ...extra },
    err,
  );
}

/** Run `command args` to completion, collecting its output (never rejects). */
function runToExit(command, args, timeoutMs) {
  return new Promise((resolve) => {
    childProcess.execFile(
      command,
      args,
      { cwd: '/', env: { ...process.env, PYTHONUNBUFFERED: '1' }, timeout: timeoutMs, killSignal: 'SIGTERM' },
      (error, stdout, stderr) => resolve({ error, stdout: String(stdout), stderr: String(stderr) }),
    );
  });
}

/** The launcher's last stderr line (the daemon's own reason), as `: <reason>`, or ''. */
function oneLineReason(stderr, log) {
  const last = stderr.split('\n').filter((l) => l.trim()).pop();
  if (!last) return '';
  const reason = last.trim().replace(/^memoryd: /, '').replace(` (log: ${log})`, '');
  return `: ${reason}`;
}

/**
 * Start the daemon with its own launcher, `memoryd serve --detach --socket PATH [--db]
 * [--config] [...autostartArgs]`: it starts memoryd in its own session (stderr appended to
 * memoryd.log next to the socket), waits for the daemon's READY=1 and exits, printing the pid.
 * It holds the start lock that memoryctl and `memoryd serve --stdio` take too, so clients of
 * every kind that start at the same moment start one daemon. Resolves `{socket, pid}` (pid
 * undefined when another daemon answered first).
 */
async function autostart(socketPath, options, deadline, connectTimeoutMs) {
  const base = options.memoryd ?? 'memoryd';
  const [command, ...prefix] = Array.isArray(base) ? base : [base];
  const args = [...prefix, 'serve', '--detach', '--socket', socketPath];
  if (options.db !== undefined) args.push('--db', path.resolve(options.db));
  if (options.config !== undefined) args.push('--config', path.resolve(options.config));
  args.push(...(options.autostartArgs ?? []));
  const log = path.join(path.dirname(socketPath), AUTOSTART_LOG);
  const details = { socketPath, log, command: [command, ...args] };
  const { error, stdout, stderr } = await runToExit(command, args, Math.max(1, Math.min(deadline - Date.now(), MAX_TIMER_MS)));
  if (error) {
    const reason = stderr.trim();
    let how;
    if (typeof error.code === 'string') how = `could not be started: ${error.message}`;
    else if (error.killed) how = `did not start on ${socketPath} in time`;
    else how = `exited with ${error.code ?? error.signal} before it was ready${oneLineReason(reason, log)}`;
    throw clientError(CONNECTION_FAILED, `memoryd ${how} (log: ${log})`, { ...details, stderr: reason, exit: { code: error.code, signal: error.signal } }, error);
  }
  const pid = stdout.trim() ? Number.parseInt(stdout, 10) : undefined;
  return { socket: await connectOnce(socketPath, connectTimeoutMs), pid };
}

/**
 * Connect to a daemon over its Unix socket and `initialize`.
 * Options: socketPath, session, write, capabilities ({approvals}), clientInfo ({name, version}),
 * timeoutMs, writeTimeoutMs, connectTimeoutMs, onApproval, onEvent, initialize (extra params);
 * wait (ms: retry while no daemon answers yet, woken by the socket's appearance);
 * autostart (spawn `memoryd serve` when none answers) with memoryd, db, config, autostartArgs.
 */
export async function connect(options = {}) {
  const socketPath = options.socketPath ?? defaultSocketPath();
  const connectTimeoutMs = options.connectTimeoutMs ?? options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  const waitMs = options.wait ?? (options.autostart ? DEFAULT_AUTOSTART_WAIT_MS : 0);
  const deadline = Date.now() + (waitMs > 0 ? waitMs : 0); // Infinity: wait for as long as it takes
  let socket;
  let autostartedPid;
  try {
    socket = await connectWaiting(socketPath, { deadline: options.autostart ? 0 : deadline, connectTimeoutMs });
  } catch (err) {
    if (!options.autostart || !NO_DAEMON_ERRNOS.includes(err.code)) throw connectFailed(socketPath, err, { waitMs });
    try {
      ({ socket, pid: autostartedPid } = await autostart(socketPath, options, deadline, connectTimeoutMs));
    } catch (startErr) {
      if (startErr instanceof MemorydError) throw startErr;
      throw connectFailed(socketPath, startErr, { waitMs });
    }
  }
  const client = new Client({
    ...options,
    readable: socket,
    writable: socket,
    destroyTransport: () => socket.destroy(),
  });
  client.socketPath = socketPath;
  if (autostartedPid !== undefined) client.autostartedPid = autostartedPid;
  try {
    await client.initialize(options.initialize ?? {}, { timeoutMs: connectTimeoutMs });
  } catch (err) {
    client.destroy();
    throw err;
  }
  return client;
}

/**
 * Spawn the daemon as a child (`memoryd serve --stdio` by default) and talk over its
 * stdin/stdout, then `initialize`. Extra options: command, args, env (merged over
 * process.env), cwd, stderr ('inherit' | 'pipe' | 'ignore'; with 'pipe' the text is kept in
 * `client.stderrText` and emitted as `stderr` events), killAfterMs (close(): grace period
 * before SIGTERM, default 5000).
 */
export async function spawn(options = {}) {
  const {
    command = 'memoryd',
    args = ['serve', '--stdio'],
    env,
    cwd,
    stderr = 'inherit',
    killAfterMs = 5000,
  } = options;
  const connectTimeoutMs = options.connectTimeoutMs ?? options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  const child = childProcess.spawn(command, args, {
    cwd,
    env: env ? { ...process.env, ...env } : process.env,
    stdio: ['pipe', 'pipe', stderr],
  });
  let spawnError;
  let exitInfo;
  const exited = new Promise((resolve) => {
    child.once('exit', (code, signal) => {
      exitInfo = { code, signal };
      resolve(exitInfo);
    });
    child.once('error', (err) => {
      spawnError = err;
      if (child.exitCode === null && child.pid === undefined) {
        exitInfo = { code: null, signal: null };
        resolve(exitInfo);
      }
    });
  });

  const shutdown = async () => {
    if (!exitInfo && child.stdin && !child.stdin.destroyed) child.stdin.end();
    const wait = (ms) => Promise.race([exited, new Promise((r) => setTimeout(r, ms).unref())]);
    if (!exitInfo) await wait(killAfterMs);
    if (!exitInfo) {
      child.kill('SIGTERM');
      await wait(2000);
    }
    if (!exitInfo) {
      child.kill('SIGKILL');
      await exited;
    }
    return exitInfo;
  };

  const client = new Client({
    ...options,
    readable: child.stdout,
    writable: child.stdin,
    shutdown,
    destroyTransport: () => {
      child.stdin?.destroy();
      if (!exitInfo) child.kill('SIGTERM');
    },
  });
  client.process = child;
  client.exited = exited;
  client.stderrText = '';
  if (stderr === 'pipe' && child.stderr) {
    child.stderr.setEncoding('utf8');
    child.stderr.on('data', (chunk) => {
      client.stderrText = (client.stderrText + chunk).slice(-1_048_576);
      client._safeEmit('stderr', chunk);
    });
  }
  child.once('error', (err) => {
    client._markClosed(clientError(CONNECTION_CLOSED, `memoryd process error: ${err.message}`, { errno: err.code }, err));
  });

  try {
    await client.initialize(options.initialize ?? {}, { timeoutMs: connectTimeoutMs });
  } catch (err) {
    client.destroy();
    if (spawnError) {
      throw clientError(CONNECTION_FAILED, `cannot spawn ${command}: ${spawnError.message}`, { command, args, errno: spawnError.code }, spawnError);
    }
    if (err.code === CONNECTION_CLOSED || err.code === TIMEOUT) {
      await Promise.race([exited, new Promise((r) => setTimeout(r, 200).unref())]);
      const tail = client.stderrText ? `: ${client.stderrText.trim().split('\n').slice(-5).join('\n')}` : '';
      throw clientError(
        CONNECTION_FAILED,
        `memoryd (${command} ${args.join(' ')}) did not initialize${exitInfo ? ` (exit ${exitInfo.code ?? exitInfo.signal})` : ''}${tail}`,
        { command, args, exit: exitInfo ?? null, stderr: client.stderrText },
        err,
      );
    }
    throw err;
  }
  return client;
}

export default { connect, spawn, Client, MemorydError, defaultSocketPath, writeContext, PROTOCOL };
