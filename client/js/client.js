// Client: one method per daemon method (wire-v1.md §4) over the Connection machinery
// (connection.js). The methods table's test reads this file for every wire method's name.

import { Connection, isDecision, decidedParams } from './connection.js';
import { PROTOCOL } from './defaults.js';

/** The write context for a session: `{agent: {session}}` (wire-v1.md §3). */
export function writeContext(session) {
  return { agent: { session } };
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
export class Client extends Connection {
  // No constructor of its own: Connection's takes every option (session, write, timeouts, …).

  // --- configuration --------------------------------------------------------------------

  /** The write context sent with write methods unless one is passed explicitly. */
  get writeContext() {
    if (this._write !== undefined) return this._write;
    return this.session ? writeContext(this.session) : undefined;
  }

  set writeContext(value) {
    this._write = value;
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
   * `audit/verify` (`{heads?}`) → LedgerReport: the daemon checks the ledger's hash chain, that
   * every audit row since the chain's start is in it unchanged, that replaying it gives the
   * live entries, that every change made outside memoryd was accepted, and that each of
   * `heads` ({n, hash} witnessed outside the store) is still in the chain. `ok` false names
   * the breaks in `problems`, the first one first.
   */
  auditVerify(params = {}, call) {
    return this.call('audit/verify', params ?? {}, call);
  }

  /**
   * `audit/accept` (`{n}`) → `{n, foreign}`: accept the change another program made to the
   * store that `foreign` ledger row `n` records; the `accepted` row names this connection.
   */
  auditAccept(n, call) {
    return this.call('audit/accept', { n }, call);
  }

  /**
   * `snapshots/prune` (`{before?}`) → `{sessions, texts, bytes, rows}`: delete the frozen
   * snapshots of sessions that ended (frozen before `before`, ms since the epoch, when given);
   * `pruned` ledger rows name them. Only a connection that may decide approvals may prune.
   */
  snapshotsPrune(params = {}, call) {
    return this.call('snapshots/prune', params ?? {}, call);
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

  /**
   * `approval/subscribe` → `{}`: this connection becomes an approver for headless writers.
   * Under approvers = "keyed" give `proof`, the approver key's answer to `approvalChallenge`.
   */
  approvalSubscribe(proof, call) {
    if (call === undefined && proof !== null && typeof proof === 'object') return this.call('approval/subscribe', {}, proof);
    return this.call('approval/subscribe', proof == null ? {} : { proof }, call);
  }

  /**
   * `approval/challenge` → `{nonce, connection, pid, start}`: a fresh nonce to prove the approver key with, once.
   * Prove it only when `pid` and `start` are both there and name this process: otherwise something may relay it.
   */
  approvalChallenge(call) {
    return this.call('approval/challenge', {}, call);
  }

  /** `approval/prove` → `{}`: `proof` answers this connection's last challenge with the approver key. */
  approvalProve(proof, call) {
    return this.call('approval/prove', { proof }, call);
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
}
