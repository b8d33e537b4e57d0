// The approval round trip (wire-v1.md §5) against a real memoryd under write policy ask.

import { test, describe, beforeEach, afterEach } from 'node:test';
import assert from 'node:assert/strict';

import { connect, spawn, WriteDeniedError, WRITE_DENIED, CONNECTION_CLOSED } from '../index.js';
import { startDaemon, makeSession, nextEvent, eventually, sleepMs, foreignRelay, ANY_APPROVERS } from '../test-support/daemon.js';

const UG = { track: 'user', scope: 'user-global' };

describe('approvals (policy ask)', () => {
  let daemon;
  const clients = [];
  const open = async (opts = {}) => {
    const c = await connect({ socketPath: daemon.socketPath, session: makeSession('s-1'), ...opts });
    clients.push(c);
    return c;
  };
  /** An approver in another process (see foreignRelay). */
  const openApprover = async (opts = {}) => {
    const c = await spawn({ ...foreignRelay(daemon.socketPath), session: makeSession('s-1'), ...opts });
    clients.push(c);
    return c;
  };
  beforeEach(async () => {
    daemon = await startDaemon({ policy: 'ask', config: ANY_APPROVERS });
  });
  afterEach(async () => {
    for (const c of clients.splice(0)) await c.close();
    await daemon.stop();
  });

  test('allow → entry written, payload is approve-what-you-see, audit labelled', async () => {
    const payloads = [];
    const client = await open({
      onApproval: async (payload) => {
        payloads.push(payload);
        return 'allowed-once';
      },
    });
    assert.equal(client.serverInfo.writePolicy, 'ask');
    const res = await client.add({ ...UG, text: 'approved fact' });
    assert.equal(res.entry.text, 'approved fact');
    assert.equal(payloads.length, 1);
    const p = payloads[0];
    assert.equal(typeof p.id, 'string');
    assert.equal(p.action, 'add');
    assert.equal(p.track, 'user');
    assert.equal(p.scope, 'user-global');
    assert.equal(p.text, 'approved fact');
    assert.equal(p.source, 'dsh-memento');
    assert.equal(p.sessionId, 's-1');
    assert.match(p.reason, /^\[dsh-memento\] add user\/user-global/);
    assert.equal('count' in p, false);
    const [row] = await client.auditList({ limit: 1 });
    assert.equal(row.action, 'add');
    assert.equal(row.outcome, 'allowed-once (via approval, writePolicy ask)');
    assert.deepEqual((await client.list()).map((e) => e.text), ['approved fact']);
  });

  test('handler returning true allows; replace payload shows from/to', async () => {
    const payloads = [];
    const client = await open({
      onApproval: (payload) => {
        payloads.push(payload);
        return true;
      },
    });
    await client.add({ ...UG, text: 'old text' });
    const res = await client.replace({ ...UG, match: 'old', text: 'new text' });
    assert.equal(res.entry.text, 'new text');
    assert.equal(payloads[1].action, 'replace');
    assert.equal(payloads[1].text, 'from:\nold text\n\nto:\nnew text');
  });

  test('reject → WRITE_DENIED with details.outcome "rejected", nothing written, denied row', async () => {
    const client = await open({ onApproval: () => 'rejected' });
    const err = await client.add({ ...UG, text: 'denied fact' }).catch((e) => e);
    assert.ok(err instanceof WriteDeniedError, String(err));
    assert.equal(err.code, WRITE_DENIED);
    assert.equal(err.rpcCode, -32014);
    assert.equal(err.details.outcome, 'rejected');
    assert.deepEqual(await client.list(), []);
    const [row] = await client.auditList({ limit: 1 });
    assert.equal(row.action, 'add-denied');
    assert.match(row.outcome, /^rejected/);
  });

  test('a throwing handler → rejected', async () => {
    const errors = [];
    const client = await open({
      onApproval: async () => {
        throw new Error('handler bug');
      },
    });
    client.on('error', (e) => errors.push(e.message));
    const err = await client.add({ ...UG, text: 'x' }).catch((e) => e);
    assert.equal(err.code, WRITE_DENIED);
    assert.equal(err.details.outcome, 'rejected');
    assert.deepEqual(errors, ['handler bug']);
  });

  test('no handler → rejected (fail closed)', async () => {
    const client = await open();
    const asked = nextEvent(client, 'approval/asked');
    const err = await client.add({ ...UG, text: 'x' }).catch((e) => e);
    assert.equal(err.code, WRITE_DENIED);
    assert.equal(err.details.outcome, 'rejected');
    assert.equal((await asked).action, 'add');
  });

  test('other outcomes deny with that outcome', async () => {
    const client = await open({ onApproval: () => 'cancelled' });
    const err = await client.remove({ ...UG, match: 'x' }).catch((e) => e);
    // nothing to remove: ENTRY_NOT_FOUND comes before the approval is asked
    assert.equal(err.code, 'ENTRY_NOT_FOUND');
    const err2 = await client.add({ ...UG, text: 'x' }).catch((e) => e);
    assert.equal(err2.code, WRITE_DENIED);
    assert.equal(err2.details.outcome, 'cancelled');
  });

  test('setApprovalHandler switches the handler at run time', async () => {
    const client = await open();
    client.setApprovalHandler(() => 'allowed-once');
    assert.equal((await client.add({ ...UG, text: 'a' })).entry.text, 'a');
    client.setApprovalHandler(undefined);
    assert.equal((await client.add({ ...UG, text: 'b' }).catch((e) => e)).code, WRITE_DENIED);
  });

  test('seed: one approval with count under ask', async () => {
    const payloads = [];
    const client = await open({ onApproval: (p) => (payloads.push(p), 'allowed-once') });
    const res = await client.seed([
      { ...UG, text: 'one' },
      { track: 'agent', scope: 'workspace', text: 'two' },
    ]);
    assert.equal(res.added, 2);
    assert.equal(payloads.length, 1);
    assert.equal(payloads[0].action, 'seed');
    assert.equal(payloads[0].count, 2);
    assert.equal(payloads[0].text, 'user/user-global: one\nagent/workspace: two');
    assert.match(payloads[0].reason, /batch\/batch/);
  });

  test('proposalsApprove and import ride the approval pipeline', async () => {
    const payloads = [];
    const client = await open({ onApproval: (p) => (payloads.push(p), 'allowed-once') });
    const prop = await client.proposalsCreate({ kind: 'compaction', ...UG, text: 'from proposal' });
    const approved = await client.proposalsApprove(prop.id);
    assert.equal(approved.entry.text, 'from proposal');
    assert.equal(payloads.at(-1).source, 'proposal');
    const env = await client.export();
    const imp = await client.import({ envelope: env });
    assert.equal(imp.added, 1);
    assert.equal(payloads.at(-1).action, 'seed');
  });

  test('approvals do not block other work on the same connection', async () => {
    let decide;
    const client = await open({ onApproval: () => new Promise((r) => (decide = r)) });
    const asked = nextEvent(client, 'approval/asked');
    const write = client.add({ ...UG, text: 'waiting' });
    await asked;
    const st = await client.status();
    assert.equal(st.pendingApprovals, 1);
    assert.deepEqual((await client.query()).entries, []);
    decide('allowed-once');
    assert.equal((await write).entry.text, 'waiting');
  });

  test('disconnect while an approval is pending → add-denied row with outcome "unavailable…"', async () => {
    const client = await open({ onApproval: () => new Promise(() => {}) });
    const asked = nextEvent(client, 'approval/asked');
    const write = client.add({ ...UG, text: 'abandoned' }).catch((e) => e);
    await asked;
    client.destroy();
    assert.equal((await write).code, CONNECTION_CLOSED);

    const other = await open();
    const row = await eventually(async () => (await other.auditList({ limit: 10 })).find((r) => r.action === 'add-denied'));
    assert.match(row.outcome, /^unavailable/);
    assert.equal(row.text, 'abandoned');
    assert.deepEqual(await other.list(), []);
    assert.equal((await other.status()).pendingApprovals, 0);
  });

  test('headless connection (approvals: false): unavailable without an approver, approved by a subscriber', async () => {
    const headless = await open({ capabilities: { approvals: false }, onApproval: () => 'allowed-once' });
    const err = await headless.add({ ...UG, text: 'no approver' }).catch((e) => e);
    assert.equal(err.code, WRITE_DENIED);
    assert.match(err.details.outcome, /^unavailable/);

    const seen = [];
    const approver = await openApprover({ session: undefined, onApproval: (p) => (seen.push(p), { outcome: 'allowed-once', by: { kind: 'human', name: 'alice' } }) });
    assert.deepEqual(await approver.approvalSubscribe(), {});
    const res = await headless.add({ ...UG, text: 'approved by subscriber' });
    assert.equal(res.entry.text, 'approved by subscriber');
    assert.equal(seen.length, 1);
    assert.equal(seen[0].text, 'approved by subscriber');
    assert.equal(seen[0].sessionId, 's-1');
    assert.match(daemon.stderr(), new RegExp(`approval ${seen[0].id} decided allowed-once by connection \\d+ \\(a subscribed approver, pid \\d+; claims human 'alice'\\)`));
  });

  test('an approver in this process is not asked about its writes', async () => {
    const headless = await open({ capabilities: { approvals: false } });
    const seen = [];
    const approver = await open({ session: undefined, onApproval: (p) => (seen.push(p), 'allowed-once') });
    await approver.approvalSubscribe();
    const err = await headless.add({ ...UG, text: 'self-approved?' }).catch((e) => e);
    assert.equal(err.code, WRITE_DENIED);
    assert.equal(err.details.outcome, 'unavailable');
    assert.deepEqual(seen, []);
    assert.deepEqual(await headless.list(), []);
  });

  test('two approvers: the first decision wins, the other sees approval/resolved', async () => {
    const headless = await open({ capabilities: { approvals: false } });
    const errors = [];
    let slowAborted = false;
    let releaseSlow;
    const fast = await openApprover({ onApproval: async () => {
      await sleepMs(50);
      return 'allowed-once';
    } });
    const slow = await openApprover({
      onApproval: (p, { signal }) =>
        new Promise((resolve) => {
          signal.addEventListener('abort', () => {
            slowAborted = true;
          });
          releaseSlow = () => resolve('rejected');
        }),
    });
    for (const c of [fast, slow]) c.on('error', (e) => errors.push(e));
    await fast.approvalSubscribe();
    await slow.approvalSubscribe();
    const resolved = nextEvent(slow, 'approval/resolved');
    const res = await headless.add({ ...UG, text: 'raced' });
    assert.equal(res.entry.text, 'raced');
    const ev = await resolved;
    assert.equal(typeof ev.id, 'string');
    assert.match(ev.outcome, /^allowed-once/);
    assert.equal(slowAborted, true);
    releaseSlow(); // moot answer: not sent
    await sleepMs(50);
    assert.deepEqual(errors, []);
    assert.deepEqual((await headless.list()).map((e) => e.text), ['raced']);
  });

  test('manual approvalDecided from an approval/asked listener', async () => {
    const client = await open();
    // no handler → the client would answer "rejected"; answer first by hand instead
    client.on('approval/asked', (p) => {
      client.approvalDecided(p.id, { outcome: 'allowed-once', by: { kind: 'script', name: 'listener' } }).catch(() => {});
    });
    const res = await client.add({ ...UG, text: 'decided by hand' });
    assert.equal(res.entry.text, 'decided by hand');
    assert.match(daemon.stderr(), /decided allowed-once by connection \d+ \(its own prompt, pid \d+; claims script 'listener'\)/);
  });
});

describe('write policy auto: no approval asked', () => {
  test('seed and add under auto send no approval/asked', async () => {
    const daemon = await startDaemon({ policy: 'auto' });
    try {
      const asked = [];
      const client = await connect({ socketPath: daemon.socketPath, session: makeSession(), onApproval: (p) => (asked.push(p), 'rejected') });
      await client.seed([{ ...UG, text: 'a' }, { ...UG, text: 'b' }]);
      await client.add({ ...UG, text: 'c' });
      assert.deepEqual(asked, []);
      const rows = await client.auditList();
      assert.ok(rows.every((r) => !r.outcome || /auto/.test(r.outcome)), JSON.stringify(rows.map((r) => r.outcome)));
      await client.close();
    } finally {
      await daemon.stop();
    }
  });

  test('policy off denies as rejected without asking', async () => {
    const daemon = await startDaemon({ policy: 'off' });
    try {
      const asked = [];
      const client = await connect({ socketPath: daemon.socketPath, session: makeSession(), onApproval: (p) => (asked.push(p), 'allowed-once') });
      const err = await client.add({ ...UG, text: 'x' }).catch((e) => e);
      assert.equal(err.code, WRITE_DENIED);
      assert.match(err.details.outcome, /^rejected/);
      assert.deepEqual(asked, []);
      await client.close();
    } finally {
      await daemon.stop();
    }
  });
});

test('time at our own approval prompt does not count against the write', async () => {
  const d = await startDaemon({ policy: 'ask' });
  try {
    const client = await connect({
      socketPath: d.socketPath,
      session: { id: 's-clock' },
      writeTimeoutMs: 300,
      onApproval: async () => {
        await new Promise((r) => setTimeout(r, 900));
        return 'allowed-once';
      },
    });
    try {
      const res = await client.add({ track: 'user', scope: 'user-global', text: 'slow human' });
      assert.equal(res.entry.text, 'slow human');
    } finally {
      await client.close();
    }
  } finally {
    await d.stop();
  }
});
