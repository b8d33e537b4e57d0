// Constants shared by the client's modules (and exported by index.js). A leaf: it imports
// nothing, so every other module can depend on it without a cycle.

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

// The default `clientInfo`; internal (index.js exports only VERSION).
export const CLIENT_NAME = 'memoryd-client';
export const CLIENT_VERSION = '0.1.0';
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
