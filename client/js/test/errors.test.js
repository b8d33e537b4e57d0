// Error mapping, pending calls on close, timeouts and aborts against a real memoryd.

import { test, describe, beforeEach, afterEach } from 'node:test';
import assert from 'node:assert/strict';

import {
  connect,
  spawn,
  MemorydError,
  BudgetExceededError,
  AmbiguousMatchError,
  EntryNotFoundError,
  InvalidInputError,
  MethodNotFoundError,
  WriteRequiresAgentError,
  AdapterNotFoundError,
  AdapterPayloadError,
  ConnectionClosedError,
  ConnectionFailedError,
  CallTimeoutError,
  BUDGET_EXCEEDED,
  AMBIGUOUS_MATCH,
  ENTRY_NOT_FOUND,
  INVALID_INPUT,
  METHOD_NOT_FOUND,
  CONNECTION_CLOSED,
  CONNECTION_FAILED,
  TIMEOUT,
  ABORTED,
  ERROR_CODES,
} from '../index.js';
import { startDaemon, makeSession, nextEvent, foreignRelay, ANY_APPROVERS } from '../test-support/daemon.js';

const UG = { track: 'user', scope: 'user-global' };

async function rejection(promise) {
  try {
    await promise;
  } catch (err) {
    return err;
  }
  assert.fail('expected a rejection');
}

describe('error mapping (policy auto)', () => {
  let daemon;
  let client;
  beforeEach(async () => {
    daemon = await startDaemon({ policy: 'auto' });
    client = await connect({ socketPath: daemon.socketPath, session: makeSession() });
  });
  afterEach(async () => {
    await client.close();
    await daemon.stop();
  });

  test('BUDGET_EXCEEDED carries track, scope, used, limit, needed', async () => {
    await client.add({ ...UG, text: 'x'.repeat(1990) });
    const err = await rejection(client.add({ ...UG, text: 'y'.repeat(20) }));
    assert.ok(err instanceof BudgetExceededError);
    assert.ok(err instanceof MemorydError);
    assert.equal(err.code, BUDGET_EXCEEDED);
    assert.equal(err.rpcCode, ERROR_CODES.BUDGET_EXCEEDED);
    assert.equal(err.details.track, 'user');
    assert.equal(err.details.scope, 'user-global');
    assert.equal(err.details.used, 1990);
    assert.equal(err.details.limit, 2000);
    assert.equal(typeof err.details.needed, 'number');
    assert.equal(typeof err.message, 'string');
    // nothing written
    assert.equal((await client.list()).length, 1);
    // a seed batch over budget is rejected as a whole
    const err2 = await rejection(client.seed([{ ...UG, text: 'ok' }, { ...UG, text: 'z'.repeat(50) }]));
    assert.equal(err2.code, BUDGET_EXCEEDED);
    assert.equal((await client.list()).length, 1);
  });

  test('AMBIGUOUS_MATCH carries candidates and samples', async () => {
    await client.add({ ...UG, text: 'alpha one' });
    await client.add({ ...UG, text: 'alpha two' });
    const err = await rejection(client.replace({ ...UG, match: 'alpha', text: 'beta' }));
    assert.ok(err instanceof AmbiguousMatchError);
    assert.equal(err.code, AMBIGUOUS_MATCH);
    assert.equal(err.rpcCode, -32013);
    assert.equal(err.details.match, 'alpha');
    assert.equal(err.details.track, 'user');
    assert.equal(err.details.scope, 'user-global');
    assert.equal(err.details.candidates, 2);
    assert.ok(Array.isArray(err.details.sample));
    assert.deepEqual([...err.details.sample].sort(), ['alpha one', 'alpha two']);
  });

  test('ENTRY_NOT_FOUND carries track, scope, match', async () => {
    const err = await rejection(client.remove({ ...UG, match: 'no such thing' }));
    assert.ok(err instanceof EntryNotFoundError);
    assert.equal(err.code, ENTRY_NOT_FOUND);
    assert.equal(err.rpcCode, -32012);
    assert.deepEqual(err.details, { ...UG, match: 'no such thing' });
  });

  test('INVALID_INPUT for params that do not fit', async () => {
    const bad = [
      client.add({ track: 'bogus', scope: 'user-global', text: 't' }),
      client.add({ ...UG, text: 't', tag: ['typo'] }),
      client.consolidate({ ...UG, matches: [], text: 't' }),
      client.query({ limit: 'ten' }),  // a limit below 1 is the default page, as the reference reads it
    ];
    for (const p of bad) {
      const err = await rejection(p);
      assert.ok(err instanceof InvalidInputError, `${err.code} ${err.message}`);
      assert.equal(err.code, INVALID_INPUT);
      assert.equal(err.rpcCode, -32602);
      assert.equal(typeof err.details, 'object');
      assert.equal(typeof err.details.field, 'string');
    }
    assert.deepEqual(await client.list(), []);
  });

  test('METHOD_NOT_FOUND via call("nope/x")', async () => {
    const err = await rejection(client.call('nope/x'));
    assert.ok(err instanceof MethodNotFoundError);
    assert.equal(err.code, METHOD_NOT_FOUND);
    assert.equal(err.rpcCode, -32601);
    assert.equal(typeof err.details, 'object');
    // the connection stays usable
    assert.equal((await client.budgets()).length, 4);
  });

  test('WRITE_REQUIRES_AGENT', async () => {
    const err = await rejection(client.add({ ...UG, text: 't' }, { write: { agent: null } }));
    assert.ok(err instanceof WriteRequiresAgentError);
    assert.equal(err.rpcCode, -32010);
  });

  test('ADAPTER_NOT_FOUND and ADAPTER_PAYLOAD', async () => {
    const e1 = await rejection(client.export({ adapter: 'nope' }));
    assert.ok(e1 instanceof AdapterNotFoundError);
    assert.equal(e1.details.adapterId, 'nope');
    assert.equal(e1.rpcCode, -32018);
    const e2 = await rejection(client.import({ adapter: 'mem0', payload: { messages: [{ role: 'user', content: 'hi' }] } }));
    assert.ok(e2 instanceof AdapterPayloadError);
    assert.equal(e2.details.adapterId, 'mem0');
    assert.equal(e2.rpcCode, -32019);
  });

  test('a line the daemon cannot parse is answered with id null → "error" event', async () => {
    const got = nextEvent(client, 'error');
    client._writable.write('this is not json\n');
    const err = await got;
    assert.equal(err.code, 'PARSE_ERROR');
    assert.equal(err.rpcCode, -32700);
    assert.equal((await client.budgets()).length, 4);
  });
});

describe('connection lifecycle (policy ask)', () => {
  let daemon;
  beforeEach(async () => {
    daemon = await startDaemon({ policy: 'ask', config: ANY_APPROVERS });
  });
  afterEach(async () => {
    await daemon.stop();
  });

  test('pending calls are rejected with CONNECTION_CLOSED on close()', async () => {
    const client = await connect({ socketPath: daemon.socketPath, session: makeSession(), onApproval: () => new Promise(() => {}) });
    const asked = nextEvent(client, 'approval/asked');
    const closeEv = nextEvent(client, 'close');
    const write = client.add({ ...UG, text: 'never decided' }).catch((e) => e);
    const write2 = client.seed([{ ...UG, text: 'never decided either' }]).catch((e) => e);
    await asked;
    assert.equal(client.pendingCount, 2);
    await client.close();
    for (const err of [await write, await write2]) {
      assert.ok(err instanceof ConnectionClosedError);
      assert.equal(err.code, CONNECTION_CLOSED);
      assert.equal(err.rpcCode, null);
    }
    assert.equal((await closeEv).code, CONNECTION_CLOSED);
    assert.equal(client.pendingCount, 0);
    assert.equal((await rejection(client.status())).code, CONNECTION_CLOSED);
    assert.equal(await client.close(), undefined); // idempotent
  });

  test('pending calls are rejected when the daemon dies', async () => {
    const client = await connect({ socketPath: daemon.socketPath, session: makeSession(), onApproval: () => new Promise(() => {}) });
    const asked = nextEvent(client, 'approval/asked');
    const write = client.add({ ...UG, text: 'x' }).catch((e) => e);
    await asked;
    const closeEv = nextEvent(client, 'close');
    daemon.proc.kill('SIGKILL');
    const err = await write;
    assert.equal(err.code, CONNECTION_CLOSED);
    await closeEv;
    assert.equal(client.closed, true);
  });

  test('SIGTERM denies a pending approval before the daemon exits', async () => {
    const client = await connect({ socketPath: daemon.socketPath, session: makeSession(), onApproval: () => new Promise(() => {}) });
    const asked = nextEvent(client, 'approval/asked');
    const write = client.add({ ...UG, text: 'x' }).catch((e) => e);
    await asked;
    daemon.proc.kill('SIGTERM');
    const err = await write;
    // wire-v1.md §2: still-pending approvals are denied before the daemon exits 0.
    assert.equal(err.code, 'WRITE_DENIED');
    assert.equal(typeof err.details.outcome, 'string');
    assert.notEqual(err.details.outcome, 'allowed-once');
    await nextEvent(client, 'close');
    assert.deepEqual(await daemon.exited, { code: 0, signal: null });
    await client.close();
  });

  test('per-call timeout (a write waiting on a slow approver elsewhere)', async () => {
    // The clock stands still while *this* connection's handler decides (see approvals tests);
    // a write routed to another approver times out on schedule.
    let decide;
    const approver = await spawn({
      ...foreignRelay(daemon.socketPath), // another process: it is asked about this one's writes
      session: makeSession(),
      onApproval: () => new Promise((r) => (decide = r)),
    });
    await approver.approvalSubscribe();
    const client = await connect({
      socketPath: daemon.socketPath,
      session: makeSession(),
      capabilities: { approvals: false },
    });
    const asked = nextEvent(approver, 'approval/asked');
    const t0 = Date.now();
    const err = await rejection(client.add({ ...UG, text: 'slow' }, { timeoutMs: 200 }));
    assert.ok(err instanceof CallTimeoutError);
    assert.equal(err.code, TIMEOUT);
    assert.equal(err.details.method, 'memory/add');
    assert.equal(err.details.timeoutMs, 200);
    assert.ok(Date.now() - t0 >= 190);
    await asked;
    decide('rejected'); // clean up the daemon side
    assert.equal(client.pendingCount, 0);
    await approver.close();
    // the connection is still fine; reads have their own default timeout
    assert.equal((await client.budgets({ timeoutMs: 20_000 })).length, 4);
    await client.close();
  });

  test('AbortSignal', async () => {
    let decide;
    const client = await connect({ socketPath: daemon.socketPath, session: makeSession(), onApproval: () => new Promise((r) => (decide = r)) });
    const ac = new AbortController();
    const asked = nextEvent(client, 'approval/asked');
    const p = client.add({ ...UG, text: 'aborted' }, { signal: ac.signal }).catch((e) => e);
    await asked;
    ac.abort();
    assert.equal((await p).code, ABORTED);
    decide('rejected');
    await client.close();
  });

  test('connect to a missing socket → CONNECTION_FAILED', async () => {
    const err = await rejection(connect({ socketPath: `${daemon.dir}/missing.sock` }));
    assert.ok(err instanceof ConnectionFailedError);
    assert.equal(err.code, CONNECTION_FAILED);
    assert.equal(err.details.errno, 'ENOENT');
  });
});

describe('daemon limits from the config file', () => {
  test('approval_timeout_s → WRITE_DENIED "cancelled", the handler is aborted via approval/resolved', async () => {
    const daemon = await startDaemon({ policy: 'ask', config: 'approval_timeout_s = 0.3\n' });
    try {
      let aborted = false;
      const client = await connect({
        socketPath: daemon.socketPath,
        session: makeSession(),
        onApproval: (p, { signal }) =>
          new Promise((resolve) => {
            signal.addEventListener('abort', () => {
              aborted = true;
              resolve('allowed-once'); // moot: not sent
            });
          }),
      });
      const errors = [];
      client.on('error', (e) => errors.push(e));
      const err = await rejection(client.add({ ...UG, text: 'too slow' }));
      assert.equal(err.code, 'WRITE_DENIED');
      assert.equal(err.details.outcome, 'cancelled');
      await new Promise((r) => setTimeout(r, 50));
      assert.equal(aborted, true);
      assert.deepEqual(errors, []);
      assert.deepEqual(await client.list(), []);
      await client.close();
    } finally {
      await daemon.stop();
    }
  });

  test('an over-long line is answered -32600 with id null: "error" event, the call times out, the connection lives', async () => {
    const daemon = await startDaemon({ policy: 'auto', config: 'max_message_bytes = 1024\n' });
    try {
      const client = await connect({ socketPath: daemon.socketPath, session: makeSession() });
      const errEv = nextEvent(client, 'error');
      const err = await rejection(client.add({ ...UG, text: 'y'.repeat(2000) }, { timeoutMs: 500 }));
      assert.equal(err.code, TIMEOUT);
      const ev = await errEv;
      assert.equal(ev.code, 'INVALID_REQUEST');
      assert.equal(ev.rpcCode, -32600);
      assert.equal((await client.add({ ...UG, text: 'short' })).entry.text, 'short');
      await client.close();
    } finally {
      await daemon.stop();
    }
  });
});
