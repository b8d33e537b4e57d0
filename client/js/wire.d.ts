// The wire contract's data as the Node client sends and receives it (wire-v1.md):
// every shape camelCase, exactly as on the wire. index.d.ts re-exports all of it.

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

/**
 * The entries to merge: exactly one of `matches` (1..20 unique substrings) or `ids` (1..20
 * entry ids of that track/scope the session sees; exact, also for entries with the same text).
 */
export type ConsolidateTargets = { matches: string[]; ids?: undefined } | { ids: string[]; matches?: undefined };

export type ConsolidateInput = {
  track: Track;
  scope: Scope;
  text: string;
  tags?: string[] | null;
  /** The merged entry's source (default 'dsh-memento'). */
  source?: string | null;
  /**
   * Where the merged entry lands: '' (the shared layer) or the session's agentPreset, as for
   * add. Absent: private when any target is (consolidation never widens by itself).
   */
  agentKey?: string | null;
} & ConsolidateTargets;

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
  /** pid to session: the kernel's facts of the socket's process at connect (a relay's own) */
  start?: number | null;
  tty?: string | null;
  session?: number | null;
  /** the harness pid memoryd's stdio relay reported (its claim) */
  harness?: number | null;
}

/** A process as the kernel showed memoryd: `start` (stat field 22) tells a reused pid apart. */
export interface ProcessFacts {
  pid: number;
  start: number;
  uid: number | null;
  exe: string | null;
  /** its controlling terminal, e.g. `pts/3`; null: none */
  tty: string | null;
  session: number;
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

/** A ledger head witnessed outside the store (a line of the store's heads file: `$XDG_STATE_HOME/memoryd/heads` for the default store, `<db>.memoryd-heads` beside any other). */
export interface HeadRef {
  n: number;
  /** sha256, lower-case hex */
  hash: string;
}

/** `audit/verify`'s params: heads witnessed outside the store, each of which must still be in the chain. */
export interface AuditVerifyParams {
  heads?: HeadRef[] | null;
}

/** `audit/accept`: the `accepted` ledger row (`n`) that records accepting the `foreign` row `foreign`. */
export interface AuditAccepted {
  n: number;
  foreign: number;
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
  /** the deciding process as the kernel showed it when the decision arrived */
  decider?: ProcessFacts | null;
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
  /** the daemon's `approvers`: under `'keyed'` an approver proves the approver key */
  approvers?: 'interactive' | 'any' | 'keyed';
}

/**
 * `approval/challenge`: prove with hex HMAC-SHA256(key, "memoryd-approver-v2\0" + nonce + "\0" + connection + "\0" + pid
 * + "\0" + start), but only when `pid` and `start` are there and name your own process: otherwise something relays
 * your connection.
 */
export interface ApprovalChallenge {
  nonce: string;
  connection: string;
  /** the pid the daemon sees on this connection's socket */
  pid: number;
  /** that process's start time (clock ticks after boot, /proc/<pid>/stat field 22); refuse a challenge without it */
  start?: number | null;
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
