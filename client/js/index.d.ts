// Type declarations for memoryd-client (wire contract: shared/design/wire-v1.md).
// Every shape is camelCase, exactly as on the wire.

/// <reference types="node" />

import { EventEmitter } from 'node:events';
import type { ChildProcess } from 'node:child_process';
import type { Readable, Writable } from 'node:stream';

import type {
  Track,
  Scope,
  WritePolicy,
  WriteAction,
  ProposalStatus,
  ApprovalOutcome,
  Entry,
  EntryInput,
  BudgetRow,
  AuditRow,
  Proposal,
  ExportEnvelope,
  SessionHeader,
  Session,
  WriteContext,
  ClientInfo,
  Capabilities,
  InitializeParams,
  Target,
  ReplaceInput,
  RemoveInput,
  ConsolidateInput,
  QueryFilter,
  QueryOpts,
  LedgerEntry,
  LedgerConnection,
  LedgerProblem,
  LedgerReport,
  AuditVerifyParams,
  AuditAccepted,
  SnapshotPruneParams,
  SnapshotPruneResult,
  LedgerDecision,
  ApprovalChallenge,
  LedgerEvent,
  EntryLife,
  AuditListParams,
  SnapshotParams,
  ExportParams,
  ImportParams,
  ProposalInput,
  ProposalListParams,
  InitializeResult,
  WriteResult,
  ReplaceResult,
  ConsolidateResult,
  SeedResult,
  QueryResult,
  SnapshotResult,
  AdapterInfo,
  ProposalApproveResult,
  DaemonStatus,
  ConnectionInfo,
  Empty,
  ApprovalEntry,
  ApprovalOrigin,
  ApprovalAsked,
  ApprovalResolved,
  MemoryAdded,
  MemoryUpdated,
  MemoryRemoved,
  MemoryRecalled,
  MemorySnapshot,
  NotificationMap,
  NotificationMethod,
} from './wire.js';
export * from './wire.js';

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
  /** `params.heads`: heads witnessed outside the store (`memoryctl audit heads`) to check too */
  auditVerify(params?: AuditVerifyParams, call?: CallOptions): Promise<LedgerReport>;
  /** `n`: the `foreign` ledger row to accept; only a connection that may decide approvals may */
  auditAccept(n: number, call?: CallOptions): Promise<AuditAccepted>;
  /** `params.before`: only snapshots frozen before it (ms); only a connection that may decide approvals may */
  snapshotsPrune(params?: SnapshotPruneParams, call?: CallOptions): Promise<SnapshotPruneResult>;
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
  /** `proof`: the approver key's answer to `approvalChallenge` (under approvers = "keyed"). */
  approvalSubscribe(proof?: string | null, call?: CallOptions): Promise<Empty>;
  approvalChallenge(call?: CallOptions): Promise<ApprovalChallenge>;
  approvalProve(proof: string, call?: CallOptions): Promise<Empty>;
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
