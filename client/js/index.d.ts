// Type declarations for memoryd-client (wire contract: shared/design/wire-v1.md).
// Every shape is camelCase, exactly as on the wire.

/// <reference types="node" />

import { EventEmitter } from 'node:events';
import type { ChildProcess } from 'node:child_process';
import type { Readable, Writable } from 'node:stream';

// --- protocol data ------------------------------------------------------------------------

export type Track = 'user' | 'agent';
export type Scope = 'user-global' | 'workspace';
export type WritePolicy = 'ask' | 'auto' | 'off';
export type WriteAction = 'add' | 'replace' | 'remove' | 'consolidate' | 'seed';
export type ProposalStatus = 'pending' | 'approved' | 'dismissed';
/** `"allowed-once"` lets a write through; anything else denies it. */
export type ApprovalOutcome = 'allowed-once' | 'rejected' | 'cancelled' | 'unavailable' | (string & {});

export interface Entry {
  id: string;
  track: Track;
  scope: Scope;
  workspaceKey: string;
  agentKey: string;
  text: string;
  source: string;
  tags: string[];
  version: number;
  /** epoch ms */
  createdAt: number;
  /** epoch ms */
  updatedAt: number;
  lastRecalled: number | null;
  recallCount: number;
  sessionId: string | null;
}

export interface EntryInput {
  track: Track;
  scope: Scope;
  text: string;
  tags?: string[] | null;
  source?: string | null;
  workspaceKey?: string | null;
  agentKey?: string | null;
}

export interface BudgetRow {
  track: Track;
  scope: Scope;
  used: number;
  limit: number;
}

export interface AuditRow {
  seq: number;
  ts: number;
  action: string;
  track: string | null;
  scope: string | null;
  entryId: string | null;
  text: string | null;
  outcome: string | null;
  source: string | null;
  sessionId: string | null;
}

export interface Proposal {
  id: string;
  kind: string;
  track: Track;
  scope: Scope;
  workspaceKey: string;
  agentKey: string;
  text: string;
  source: string;
  sessionId: string | null;
  status: ProposalStatus;
  createdAt: number;
  decidedAt: number | null;
}

export interface ExportEnvelope {
  plugin: string;
  schema: string;
  /** ISO 8601 */
  exportedAt: string;
  budgets: BudgetRow[];
  entries: Entry[];
}

// --- context objects ------------------------------------------------------------------------

export interface SessionHeader {
  cwd?: string | null;
  agentPreset?: string | null;
  [key: string]: unknown;
}

export interface Session {
  id?: string | null;
  header?: SessionHeader | null;
  [key: string]: unknown;
}

/** The write context of every write method: `{agent: {session: {id, header}}}`. */
export interface WriteContext {
  agent?: { session?: Session | null; [key: string]: unknown } | null;
  [key: string]: unknown;
}

export interface ClientInfo {
  name?: string;
  version?: string;
  [key: string]: unknown;
}

export interface Capabilities {
  /** false: this connection cannot answer approvals; its writes are asked of subscribed approvers. */
  approvals?: boolean;
  [key: string]: unknown;
}

// --- method params ----------------------------------------------------------------------------

export interface InitializeParams {
  protocol?: string;
  client?: ClientInfo;
  capabilities?: Capabilities;
  [key: string]: unknown;
}

/**
 * How replace/remove name their target: exactly one of `match` (a unique substring of its
 * text) or `id` (its entry id; it must be an entry of that track/scope the session sees).
 * `id` is how to pick one of two entries with the same text.
 */
export type Target = { match: string; id?: undefined } | { id: string; match?: undefined };

export type ReplaceInput = {
  track: Track;
  scope: Scope;
  text: string;
  tags?: string[] | null;
} & Target;

export type RemoveInput = {
  track: Track;
  scope: Scope;
} & Target;

export interface ConsolidateInput {
  track: Track;
  scope: Scope;
  /** 1..20 unique substrings */
  matches: string[];
  text: string;
  tags?: string[] | null;
}

export interface QueryFilter {
  track?: Track | null;
  scope?: Scope | null;
  text?: string | null;
  /** default 20 (daemon config), hard cap 1000 */
  limit?: number | null;
}

export interface QueryOpts {
  /** records a `recalled` audit row and a `memory/recalled` event */
  sessionId?: string | null;
  agentKey?: string | null;
  workspaceKey?: string | null;
}

/** An entry as the ledger proves it: what `audit/verify`'s replay compares with the live store. */
export interface LedgerEntry {
  id: string;
  track: Track;
  scope: Scope;
  workspaceKey: string;
  agentKey: string;
  text: string;
  tags: string[];
  source: string;
  version: number;
}

/** A connection as the ledger recorded it, before the first row that names it. */
export interface LedgerConnection {
  /** `<run>/<id>`: the daemon run (a fresh id each start) and the connection's number */
  ref: string;
  run: string;
  id: number;
  transport: string;
  pid: number | null;
  uid: number | null;
  exe: string | null;
  /** what the connection sent in `initialize` (its own claim) */
  client: ClientInfo | null;
  openedAt: number;
}

/** One break that `audit/verify` found. */
export interface LedgerProblem {
  reason: string;
  /** the ledger row (`memoryd_ledger.n`) concerned, when one is */
  n?: number;
  /** the audit row (`audit.seq`) concerned, when one is */
  seq?: number;
}

/** `audit/verify`: `ok` when the chain holds, every audit row since its start is in it unchanged, and replaying it gives the live entries. */
export interface LedgerReport {
  ok: boolean;
  /** ledger rows */
  rows: number;
  /** audit rows in the chain */
  auditRows: number;
  /** audit rows up to this seq predate the chain (a dsh-memento store's, say) */
  afterAuditSeq: number;
  note: string;
  /** the newest row's hash: keep it to detect a later truncation of the ledger */
  head: string;
  /** the first one is the first break */
  problems: LedgerProblem[];
}

/** How the approval of a ledger event went. */
export interface LedgerDecision {
  approval: string;
  outcome: string | null;
  policy: string | null;
  /** the connection that decided; null when nobody did (timeout, disconnect, shutdown) */
  decidedBy: LedgerConnection | null;
  /** who decided, as the deciding client claimed it */
  by: { kind: 'human' | 'policy' | 'script'; name: string | null } | null;
  /** the approval's reason line, as the approver saw it */
  reason: string | null;
  /** the error code, when the approved write then failed to commit */
  failed: string | null;
}

/** One ledger row that wrote an entry (or `present-at-start`: it was there when the chain began). */
export interface LedgerEvent {
  n: number;
  seq: number | null;
  ts: number;
  action: string;
  outcome: string | null;
  text: string | null;
  sessionId: string | null;
  askedBy: LedgerConnection | null;
  decision: LedgerDecision | null;
}

/** `audit/explain`: one entry's life. */
export interface EntryLife {
  entryId: string;
  /** null: the entry is no longer in the store */
  current: LedgerEntry | null;
  events: LedgerEvent[];
  /** the sessions whose frozen snapshot showed one of its texts */
  snapshots: string[];
}

export interface AuditListParams {
  /** default 100 */
  limit?: number | null;
}

export interface SnapshotParams {
  language?: 'en' | 'zh' | null;
}

export interface ExportParams {
  adapter?: string | null;
}

/** `envelope` must say `plugin: 'dsh-memento'` and `schema: 'memory-export-v1'` (as `export()`
 *  returns it), else INVALID_INPUT (`envelope.plugin` / `envelope.schema`). */
export type ImportParams = (
  | { envelope: ExportEnvelope | Record<string, unknown>; adapter?: undefined; payload?: undefined; write?: WriteContext | null }
  | { adapter: string; payload: unknown; envelope?: undefined; write?: WriteContext | null }
) & {
  /**
   * true: leave out every entry whose track, scope, workspaceKey, agentKey and text already
   * exist (counted in `skipped`); when that is all of them, nothing is written or asked.
   */
  skipExisting?: boolean | null;
};

export interface ProposalInput {
  kind: string;
  track: Track;
  scope: Scope;
  text: string;
  source?: string | null;
}

export interface ProposalListParams {
  status?: ProposalStatus | null;
}

// --- results ----------------------------------------------------------------------------------

export interface InitializeResult {
  protocol: string;
  server: { name: string; version: string };
  schemaVersion: number;
  writePolicy: WritePolicy;
  budgets: BudgetRow[];
}

export interface WriteResult {
  entry: Entry;
  usage: BudgetRow;
}

export interface ReplaceResult {
  previous: Entry;
  entry: Entry;
  usage: BudgetRow;
}

export interface ConsolidateResult {
  removed: Entry[];
  entry: Entry;
  usage: BudgetRow;
}

export interface SeedResult {
  added: number;
  entries: Entry[];
  /** import with `skipExisting` only: the entries left out because they already exist */
  skipped?: number;
}

export interface QueryResult {
  entries: Entry[];
  total: number;
  truncated: boolean;
}

export interface SnapshotResult {
  text: string;
}

export interface AdapterInfo {
  id: string;
  name: string;
  description: string;
  version: string;
  importFormats: string[];
  exportFormat: string;
}

export interface ProposalApproveResult {
  proposal: Proposal;
  entry: Entry;
  usage: BudgetRow;
}

export interface DaemonStatus {
  version: string;
  uptimeS: number;
  connections: number;
  pendingApprovals: number;
  queueDepth: number;
  store: { path: string; schemaVersion: number };
  /** The daemon's process id. */
  pid: number;
  /** The default write policy. */
  writePolicy: WritePolicy;
  /** The socket it bound and removes on stop; null on stdio or under systemd socket activation. */
  socket: string | null;
  /** The config file it loaded, or null. */
  config: string | null;
  /** The file its stderr (the log) goes to, or null when stderr is not a regular file. */
  log: string | null;
  /** The live connections (`connections` is their count), the asking one included, oldest first. */
  connectionList: ConnectionInfo[];
}

/** One live connection: the kernel's peer credentials and /proc beside the client's own claim. */
export interface ConnectionInfo {
  id: number;
  transport: "socket" | "stdio";
  /** Peer pid (SO_PEERCRED; for a `memoryd serve --stdio` relay, the harness behind it). */
  pid: number | null;
  /** Peer uid (SO_PEERCRED): the daemon's own or root; other uids are refused at accept. */
  uid: number | null;
  /** The peer's executable (/proc/<pid>/exe), or null when unreadable. */
  exe: string | null;
  /** `initialize`'s `client`, as the peer names itself; null before initialize. */
  client: { name: string | null; version: string | null } | null;
  /** Subscribed with `approval/subscribe`. */
  approver: boolean;
  /** When the daemon accepted it (ms since the epoch). */
  openedAt: number;
}

export type Empty = Record<string, never>;

// --- notifications ----------------------------------------------------------------------------

/** One entry of a seed/import batch, as its approval shows it. */
export interface ApprovalEntry {
  track: Track;
  scope: Scope;
  workspaceKey: string;
  agentKey: string;
  text: string;
  tags: string[];
}

/** The connection that asked: its `initialize` client info and its peer process. */
export interface ApprovalOrigin {
  /** `initialize` params `client.name` (the client's own claim) */
  name?: string;
  version?: string;
  /** the socket's peer process (kernel peer credentials) */
  pid?: number;
  /** that process's executable, when readable */
  exe?: string;
}

export interface ApprovalAsked {
  id: string;
  action: WriteAction;
  track: string;
  scope: string;
  /** approve-what-you-see payload text */
  text: string;
  source: string;
  sessionId: string | null;
  reason: string;
  /** seed only */
  count?: number;
  /** where the entry lands (add), or the target's keys (replace, remove; consolidate: the merged entry's); not for seed */
  workspaceKey?: string;
  agentKey?: string;
  /** the entry's tags after the write (remove: the target's); not for seed */
  tags?: string[];
  /** seed and import: every entry of the batch */
  entries?: ApprovalEntry[];
  /** the JSON-RPC id of the write that asked; only on the connection that sent it */
  requestId?: string | number;
  origin?: ApprovalOrigin;
}

export interface ApprovalResolved {
  id: string;
  outcome: ApprovalOutcome;
}

/** The entry events carry the writing session's id (`write.agent.session.id`); absent when the write named none. */
export interface MemoryAdded {
  entry: Entry;
  sessionId?: string;
}

/** Watchers get it when their session sees the previous entry or the new one. */
export interface MemoryUpdated {
  previous: Entry;
  entry: Entry;
  sessionId?: string;
}

export interface MemoryRemoved {
  entry: Entry;
  sessionId?: string;
}

export interface MemoryRecalled {
  query: string;
  /** the number of hits: the query's `total` (not only the returned page) */
  matches: number;
  sessionId: string | null;
}

export interface MemorySnapshot {
  sessionId: string;
  text: string;
}

export interface NotificationMap {
  'approval/asked': ApprovalAsked;
  'approval/resolved': ApprovalResolved;
  'memory/added': MemoryAdded;
  'memory/updated': MemoryUpdated;
  'memory/removed': MemoryRemoved;
  'memory/recalled': MemoryRecalled;
  'memory/snapshot': MemorySnapshot;
}

export type NotificationMethod = keyof NotificationMap;

// --- errors -----------------------------------------------------------------------------------

// Generated from the protocol package's error and methods tables (protocol.d.ts): the
// codes, their constants, their classes and each error's details.
import type { ErrorDetails, ProtocolErrorCode, RpcLevelErrorCode } from './protocol.js';
export * from './protocol.js';
export type ClientErrorCode = 'CONNECTION_CLOSED' | 'CONNECTION_FAILED' | 'TIMEOUT' | 'ABORTED' | 'PROTOCOL_ERROR';
export type ErrorCode = ProtocolErrorCode | RpcLevelErrorCode | ClientErrorCode | 'RPC_ERROR' | (string & {});

export type BudgetExceededDetails = ErrorDetails['BUDGET_EXCEEDED'];
export type EntryNotFoundDetails = ErrorDetails['ENTRY_NOT_FOUND'];
export type AmbiguousMatchDetails = ErrorDetails['AMBIGUOUS_MATCH'];
export type StoreUnavailableDetails = ErrorDetails['STORE_UNAVAILABLE'];
export type WriteDeniedDetails = ErrorDetails['WRITE_DENIED'];

export declare const CLIENT_CODES: Readonly<{ [K in ClientErrorCode]: K }>;

export declare const CONNECTION_CLOSED: 'CONNECTION_CLOSED';
export declare const CONNECTION_FAILED: 'CONNECTION_FAILED';
export declare const TIMEOUT: 'TIMEOUT';
export declare const ABORTED: 'ABORTED';
export declare const PROTOCOL_ERROR: 'PROTOCOL_ERROR';

/** `-32011` → `'BUDGET_EXCEEDED'`; unknown codes → `'RPC_ERROR'`. */
export declare function codeForRpcCode(rpcCode: number): ErrorCode;

export interface MemorydErrorOptions<D> {
  code?: ErrorCode;
  rpcCode?: number | null;
  details?: D;
  data?: unknown;
  cause?: unknown;
}

/** Every rejection from this client is a MemorydError (or one of its subclasses). */
export declare class MemorydError<D extends object = Record<string, unknown>> extends Error {
  constructor(message: string, opts?: MemorydErrorOptions<D>);
  /** `error.data.code`, else a name derived from the JSON-RPC code, else a client code. */
  code: ErrorCode;
  /** The JSON-RPC numeric code; null for client-side failures (CONNECTION_CLOSED, TIMEOUT, …). */
  rpcCode: number | null;
  /** `error.data.details`, or `{}`. */
  details: D;
  /** The raw `error.data`, when the daemon sent one. */
  data?: unknown;
  static fromWire(error: unknown): MemorydError;
}

export declare class ConnectionClosedError extends MemorydError {}
export declare class ConnectionFailedError extends MemorydError {}
export declare class CallTimeoutError extends MemorydError<{ method: string; timeoutMs: number }> {}
export declare class AbortedError extends MemorydError<{ method: string }> {}

export declare function errorClassFor(code: string): typeof MemorydError;
export declare function clientError(code: string, message: string, details?: object, cause?: unknown): MemorydError;

// --- framing ----------------------------------------------------------------------------------

export declare class LineDecoder {
  constructor(opts?: { maxLineBytes?: number; onOverflow?: () => void });
  /** Feed a chunk; returns the complete lines so far (no terminator; blank lines skipped). */
  push(chunk: Uint8Array | string): string[];
  /** End of stream: returns a final unterminated line, if any. */
  end(): string[];
}

export declare function encodeMessage(message: unknown): string;

// --- client -----------------------------------------------------------------------------------

export interface CallOptions {
  /** Per-call timeout; 0 or Infinity disables it. Default: `client.timeoutMs` (30 s). */
  timeoutMs?: number;
  /** Abort waiting for the response (rejects with ABORTED; the daemon may still act). */
  signal?: AbortSignal;
}

export interface WriteOptions extends CallOptions {
  /** Explicit write context (null sends `write: null`, which the daemon refuses). */
  write?: WriteContext | null;
  /** Shorthand: `{agent: {session}}`. Ignored when `write` is given. */
  session?: Session | null;
  /** Default for writes: `client.writeTimeoutMs` (330 s, longer than the daemon's approval timeout). */
  timeoutMs?: number;
}

export interface ApprovalContext {
  /** Aborted when another approver decided first (`approval/resolved`) or the connection closed. */
  signal: AbortSignal;
  client: Client;
  /**
   * The call of this connection that asked (`payload.requestId` names it): its JSON-RPC id,
   * method and params as sent. All three are undefined when the ask names no in-flight call of
   * this connection (an approver deciding for another connection, or a daemon without requestId).
   */
  requestId?: number | string;
  method?: string;
  params?: unknown;
}

/** Who decided an approval, as the deciding client claims it (`approval/decided`'s `by`). */
export interface ApprovalBy {
  kind: 'human' | 'policy' | 'script';
  /** 1 to 128 characters */
  name?: string;
}

/** An outcome with the client's claim of who decided. */
export interface ApprovalDecision {
  outcome: ApprovalOutcome | boolean;
  by?: ApprovalBy;
}

/**
 * Decide an approval. Return an outcome string (`'allowed-once'` lets the write through;
 * anything else denies it), or `true` (= 'allowed-once') / `false` or nothing (= 'rejected'),
 * or `{outcome, by}` to say who decided (`by` is sent in `approval/decided`).
 * A handler that throws answers 'rejected'.
 */
export type ApprovalHandler = (
  payload: ApprovalAsked,
  ctx: ApprovalContext,
) =>
  | ApprovalOutcome
  | ApprovalDecision
  | boolean
  | void
  | null
  | Promise<ApprovalOutcome | ApprovalDecision | boolean | void | null>;

export type EventHandler = <M extends string>(
  method: M,
  params: M extends NotificationMethod ? NotificationMap[M] : unknown,
) => void;

export interface ClientOptions {
  /** Session used for the default write context, `snapshot()` and `proposalsCreate()`. */
  session?: Session;
  /** Full default write context; overrides the one derived from `session`. */
  write?: WriteContext;
  /** Sent in `initialize`; default `{approvals: true}`. */
  capabilities?: Capabilities;
  /** Sent in `initialize`; default `{name: 'memoryd-client', version}`. */
  clientInfo?: ClientInfo;
  /** Default per-call timeout (ms), default 30 000. */
  timeoutMs?: number;
  /** Default timeout of write calls (ms), default 330 000. */
  writeTimeoutMs?: number;
  onApproval?: ApprovalHandler;
  /** Called with every daemon notification. */
  onEvent?: EventHandler;
  /** Incoming lines longer than this are dropped (reported as an `error` event). */
  maxMessageBytes?: number;
}

export interface StreamClientOptions extends ClientOptions {
  readable: Readable;
  writable?: Writable;
  /** Called by close() after pending calls are rejected; its result is close()'s result. */
  shutdown?: () => Promise<unknown>;
  /** Called by destroy(). */
  destroyTransport?: () => void;
}

export interface ConnectOptions extends ClientOptions {
  /** Default: `defaultSocketPath()`. */
  socketPath?: string;
  /**
   * Milliseconds to keep trying while no daemon answers yet (ENOENT / ECONNREFUSED): each retry
   * is woken by a change in the socket's directory (`fs.watch`; the daemon moves its socket into
   * place once it listens), not by a fixed sleep. Default 0 (fail at once); with `autostart`,
   * 10 000. `Infinity` waits for as long as it takes.
   */
  wait?: number;
  /**
   * When nothing answers, run the daemon's launcher `<memoryd> serve --detach --socket
   * <socketPath> [--db] [--config] [...autostartArgs]`: it starts memoryd detached (stderr
   * appended to `memoryd.log` next to the socket) and returns once the daemon reported
   * READY=1. It takes the start lock memoryctl and `memoryd serve --stdio` take too, so
   * starters of every kind that race start one daemon. Bounded by `wait`.
   */
  autostart?: boolean;
  /** The daemon command for `autostart`: `'memoryd'` (default), or `[command, ...args]` such as `['python3', '-m', 'memoryd']`. */
  memoryd?: string | string[];
  /** `--db` for an autostarted daemon (resolved to an absolute path). */
  db?: string;
  /** `--config` for an autostarted daemon (resolved to an absolute path). */
  config?: string;
  /** More `memoryd serve` arguments for an autostarted daemon, e.g. `['--write-policy', 'ask']`. */
  autostartArgs?: string[];
  /** Timeout for connecting and `initialize` (default: timeoutMs). */
  connectTimeoutMs?: number;
  /** Extra/overriding `initialize` params. */
  initialize?: InitializeParams;
}

export interface SpawnOptions extends ConnectOptions {
  /** Default `'memoryd'`. */
  command?: string;
  /** Default `['serve', '--stdio']`. */
  args?: string[];
  /** Merged over process.env. */
  env?: NodeJS.ProcessEnv;
  cwd?: string;
  /** Daemon stderr: passed through (default), collected into `client.stderrText`, or dropped. */
  stderr?: 'inherit' | 'pipe' | 'ignore';
  /** close(): how long to wait for exit after ending stdin before SIGTERM (default 5000). */
  killAfterMs?: number;
}

export interface ExitInfo {
  code: number | null;
  signal: NodeJS.Signals | null;
}

export interface ClientEvents {
  'approval/asked': [ApprovalAsked];
  'approval/resolved': [ApprovalResolved];
  'memory/added': [MemoryAdded];
  'memory/updated': [MemoryUpdated];
  'memory/removed': [MemoryRemoved];
  'memory/recalled': [MemoryRecalled];
  'memory/snapshot': [MemorySnapshot];
  notification: [method: string, params: unknown];
  close: [reason: MemorydError];
  error: [err: Error];
  stderr: [chunk: string];
}

export declare class Client extends EventEmitter {
  constructor(options: StreamClientOptions);

  session: Session | undefined;
  capabilities: Capabilities;
  clientInfo: ClientInfo;
  timeoutMs: number;
  writeTimeoutMs: number;
  /** The `initialize` result. */
  serverInfo: InitializeResult | undefined;
  closed: boolean;
  closeReason: MemorydError | undefined;
  /** The default write context (from `write` or `session`). */
  writeContext: WriteContext | undefined;
  readonly approvalHandler: ApprovalHandler | undefined;
  readonly pendingCount: number;
  /** connect() only. */
  socketPath?: string;
  /** connect({autostart}) only: the pid of the daemon this call started (undefined when one already answered). */
  autostartedPid?: number;
  /**
   * The `opts` `query()` sends when given none: the session's visible set,
   * `{sessionId?, agentKey: header.agentPreset ?? '', workspaceKey: header.cwd ?? ''}`
   * (`sessionId` only when the session has an id); undefined without a session.
   */
  readonly queryOpts: QueryOpts | undefined;
  /** spawn() only. */
  process?: ChildProcess;
  /** spawn() only: resolves when the daemon exits. */
  exited?: Promise<ExitInfo>;
  /** spawn() with stderr 'pipe': the daemon's stderr (last 1 MiB). */
  stderrText?: string;

  setApprovalHandler(handler: ApprovalHandler | undefined): this;

  call<T = unknown>(method: string, params?: unknown, opts?: CallOptions): Promise<T>;
  notify(method: string, params?: unknown): void;

  initialize(params?: InitializeParams, opts?: CallOptions): Promise<InitializeResult>;
  add(input: EntryInput, opts?: WriteOptions): Promise<WriteResult>;
  replace(input: ReplaceInput, opts?: WriteOptions): Promise<ReplaceResult>;
  remove(input: RemoveInput, opts?: WriteOptions): Promise<WriteResult>;
  consolidate(input: ConsolidateInput, opts?: WriteOptions): Promise<ConsolidateResult>;
  seed(inputs: EntryInput[], opts?: WriteOptions): Promise<SeedResult>;
  /** `opts` left out: `queryOpts` (the session's visible set); `null` or `{}`: the whole store. */
  query(filter?: QueryFilter | null, opts?: QueryOpts | null, call?: CallOptions): Promise<QueryResult>;
  budgets(call?: CallOptions): Promise<BudgetRow[]>;
  list(call?: CallOptions): Promise<Entry[]>;
  auditList(params?: AuditListParams, call?: CallOptions): Promise<AuditRow[]>;
  auditVerify(call?: CallOptions): Promise<LedgerReport>;
  /** `target`: an entry id, or a text that exactly one entry contains */
  auditExplain(target: string, call?: CallOptions): Promise<EntryLife>;
  snapshot(session?: Session, params?: SnapshotParams, call?: CallOptions): Promise<SnapshotResult>;
  export(params?: { adapter?: null }, call?: CallOptions): Promise<ExportEnvelope>;
  export(params: ExportParams, call?: CallOptions): Promise<unknown>;
  import(params: ImportParams, opts?: WriteOptions): Promise<SeedResult>;
  adaptersList(call?: CallOptions): Promise<AdapterInfo[]>;
  proposalsCreate(input: ProposalInput, session?: Session, call?: CallOptions): Promise<Proposal | null>;
  proposalsList(params?: ProposalListParams, call?: CallOptions): Promise<Proposal[]>;
  proposalsApprove(id: string, opts?: WriteOptions): Promise<ProposalApproveResult>;
  proposalsDismiss(id: string, call?: CallOptions): Promise<Proposal>;
  approvalDecided(id: string, outcome: ApprovalOutcome | ApprovalDecision, call?: CallOptions): Promise<Empty>;
  approvalSubscribe(call?: CallOptions): Promise<Empty>;
  /**
   * `memory/watch` → `{}`: this connection also gets `memory/added`, `memory/updated` and
   * `memory/removed` for other connections' writes of entries `session` (default: the
   * connection's) sees; listen with `on('memory/added', …)`. At most 16 sessions per connection.
   */
  watch(session?: Session, call?: CallOptions): Promise<Empty>;
  status(call?: CallOptions): Promise<DaemonStatus>;

  /** Rejects pending calls (CONNECTION_CLOSED), then shuts the transport down. spawn(): resolves to the exit info. */
  close(): Promise<ExitInfo | undefined>;
  destroy(): void;
  [Symbol.asyncDispose](): Promise<void>;

  on<K extends keyof ClientEvents>(event: K, listener: (...args: ClientEvents[K]) => void): this;
  on(event: string | symbol, listener: (...args: any[]) => void): this;
  once<K extends keyof ClientEvents>(event: K, listener: (...args: ClientEvents[K]) => void): this;
  once(event: string | symbol, listener: (...args: any[]) => void): this;
  off<K extends keyof ClientEvents>(event: K, listener: (...args: ClientEvents[K]) => void): this;
  off(event: string | symbol, listener: (...args: any[]) => void): this;
  addListener<K extends keyof ClientEvents>(event: K, listener: (...args: ClientEvents[K]) => void): this;
  addListener(event: string | symbol, listener: (...args: any[]) => void): this;
  removeListener<K extends keyof ClientEvents>(event: K, listener: (...args: ClientEvents[K]) => void): this;
  removeListener(event: string | symbol, listener: (...args: any[]) => void): this;
}

// --- module functions ---------------------------------------------------------------------

export declare const PROTOCOL: 'dsh-memory-protocol/v1';
export declare const VERSION: string;
export declare const DEFAULT_TIMEOUT_MS: number;
export declare const DEFAULT_WRITE_TIMEOUT_MS: number;
export declare const ALLOWED_ONCE: 'allowed-once';
export declare const REJECTED: 'rejected';
export declare const NOTIFICATIONS: readonly NotificationMethod[];
/** errno codes of a connect that mean "no daemon there (yet)": `['ENOENT', 'ECONNREFUSED']`. */
export declare const NO_DAEMON_ERRNOS: readonly string[];
/** How long `connect({autostart: true})` waits by default (10 000 ms). */
export declare const DEFAULT_AUTOSTART_WAIT_MS: number;
/** `'memoryd.log'`: an autostarted daemon's stderr, next to the socket. */
export declare const AUTOSTART_LOG: string;

/** `$MEMORYD_SOCKET`, else `$XDG_RUNTIME_DIR/memoryd/memoryd.sock`, else `<tmpdir>/memoryd-<uid>/memoryd.sock`. */
export declare function defaultSocketPath(env?: NodeJS.ProcessEnv): string;
/** `{agent: {session}}` */
export declare function writeContext(session: Session): WriteContext;
/** Connect to a daemon's Unix socket (waiting for it, or starting it, if asked) and `initialize`. */
export declare function connect(options?: ConnectOptions): Promise<Client>;
/** Spawn `memoryd serve --stdio` (or `command args`) and `initialize` over its stdio. */
export declare function spawn(options?: SpawnOptions): Promise<Client>;

declare const _default: {
  connect: typeof connect;
  spawn: typeof spawn;
  Client: typeof Client;
  MemorydError: typeof MemorydError;
  defaultSocketPath: typeof defaultSocketPath;
  writeContext: typeof writeContext;
  PROTOCOL: typeof PROTOCOL;
};
export default _default;
