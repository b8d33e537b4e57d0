// Every daemon method against a real memoryd (write policy auto, unless stated).

import { test, describe, beforeEach, afterEach } from 'node:test';
import assert from 'node:assert/strict';

import { connect, PROTOCOL, MemorydError } from '../index.js';
import { startDaemon, makeSession, nextEvent, eventually, ANY_APPROVERS } from '../test-support/daemon.js';

const UG = { track: 'user', scope: 'user-global' };
const AW = { track: 'agent', scope: 'workspace' };

describe('daemon methods (policy auto)', () => {
  let daemon;
  let client;
  const session = makeSession('s-1');
  const clients = [];
  const open = async (opts = {}) => {
    const c = await connect({ socketPath: daemon.socketPath, session, ...opts });
    clients.push(c);
    return c;
  };

  beforeEach(async () => {
    daemon = await startDaemon({ policy: 'auto', config: ANY_APPROVERS });
    client = await open();
  });

  afterEach(async () => {
    for (const c of clients.splice(0)) await c.close();
    await daemon.stop();
  });

  test('initialize: server info kept on the client', async () => {
    const info = client.serverInfo;
    assert.equal(info.protocol, PROTOCOL);
    assert.equal(info.server.name, 'memoryd');
    assert.equal(typeof info.server.version, 'string');
    assert.equal(info.schemaVersion, 4);
    assert.equal(info.writePolicy, 'auto');
    assert.deepEqual(
      info.budgets.map((b) => [b.track, b.scope, b.used]),
      [['user', 'user-global', 0], ['user', 'workspace', 0], ['agent', 'user-global', 0], ['agent', 'workspace', 0]],
    );
    // initialize may be called again
    const again = await client.initialize();
    assert.equal(again.protocol, PROTOCOL);
  });

  test('add / list / budgets, with memory/added event and no approval asked under auto', async () => {
    const asked = [];
    client.on('approval/asked', (p) => asked.push(p));
    const added = nextEvent(client, 'memory/added');
    const res = await client.add({ ...UG, text: 'prefers tabs', tags: ['style'] });
    assert.equal(res.entry.text, 'prefers tabs');
    assert.equal(res.entry.track, 'user');
    assert.equal(res.entry.scope, 'user-global');
    assert.equal(res.entry.version, 1);
    assert.deepEqual(res.entry.tags, ['style']);
    assert.equal(res.entry.sessionId, 's-1');
    assert.equal(res.entry.recallCount, 0);
    assert.equal(res.entry.lastRecalled, null);
    assert.equal(typeof res.entry.id, 'string');
    assert.deepEqual(res.usage, { ...UG, used: 'prefers tabs'.length, limit: 2000 });
    assert.deepEqual((await added).entry, res.entry);

    const ws = await client.add({ ...AW, text: 'uses pnpm 😀' });
    assert.equal(ws.entry.workspaceKey !== '', true);
    assert.equal(ws.entry.agentKey, 'coder');
    assert.equal(ws.usage.used, 'uses pnpm 😀'.length); // UTF-16 code units

    const list = await client.list();
    assert.deepEqual(list.map((e) => e.id), [res.entry.id, ws.entry.id]);
    const budgets = await client.budgets();
    assert.equal(budgets.length, 4);
    assert.deepEqual(budgets[0], { ...UG, used: 12, limit: 2000 });
    assert.deepEqual(budgets[3], { ...AW, used: 'uses pnpm 😀'.length, limit: 4000 });
    assert.deepEqual(asked, []);
  });

  test('replace with memory/updated event', async () => {
    const { entry } = await client.add({ ...UG, text: 'likes dark mode', tags: ['ui'] });
    const updated = nextEvent(client, 'memory/updated');
    const res = await client.replace({ ...UG, match: 'DARK', text: 'likes light mode' });
    assert.equal(res.previous.text, 'likes dark mode');
    assert.equal(res.entry.id, entry.id);
    assert.equal(res.entry.version, 2);
    assert.deepEqual(res.entry.tags, ['ui']); // kept when not given
    assert.equal(res.usage.used, 'likes light mode'.length);
    const ev = await updated;
    assert.equal(ev.previous.text, 'likes dark mode');
    assert.equal(ev.entry.text, 'likes light mode');
  });

  test('remove with memory/removed event', async () => {
    const { entry } = await client.add({ ...UG, text: 'temporary fact' });
    const removed = nextEvent(client, 'memory/removed');
    const res = await client.remove({ ...UG, match: 'temporary' });
    assert.equal(res.entry.id, entry.id);
    assert.equal(res.usage.used, 0);
    assert.equal((await removed).entry.id, entry.id);
    assert.deepEqual(await client.list(), []);
  });

  test('consolidate', async () => {
    await client.add({ ...UG, text: 'fact one' });
    await client.add({ ...UG, text: 'fact two' });
    await client.add({ ...UG, text: 'other' });
    const res = await client.consolidate({ ...UG, matches: ['fact one', 'fact two'], text: 'facts one and two', tags: ['merged'] });
    assert.deepEqual(res.removed.map((e) => e.text).sort(), ['fact one', 'fact two']);
    assert.equal(res.entry.text, 'facts one and two');
    assert.equal(res.entry.version, 1);
    assert.equal(res.usage.used, 'other'.length + 'facts one and two'.length);
    assert.deepEqual((await client.list()).map((e) => e.text), ['other', 'facts one and two']);
  });

  test('seed', async () => {
    const res = await client.seed([
      { ...UG, text: 'seed a' },
      { ...AW, text: 'seed b', tags: ['t'] },
    ]);
    assert.equal(res.added, 2);
    assert.deepEqual(res.entries.map((e) => e.text), ['seed a', 'seed b']);
    const audit = await client.auditList({ limit: 10 });
    assert.ok(audit.some((r) => r.action === 'seed'));
  });

  test('query: filter, limit/truncated, recall counting, memory/recalled', async () => {
    await client.seed([
      { ...UG, text: 'Alpha apple' },
      { ...UG, text: 'alpha banana' },
      { ...AW, text: 'gamma' },
    ]);
    const all = await client.query();
    assert.equal(all.total, 3);
    assert.equal(all.truncated, false);
    const hits = await client.query({ text: 'ALPHA' });
    assert.equal(hits.total, 2);
    const page = await client.query({ text: 'alpha', limit: 1 });
    assert.equal(page.entries.length, 1);
    assert.equal(page.total, 2);
    assert.equal(page.truncated, true);
    const scoped = await client.query({ track: 'agent', scope: 'workspace' });
    assert.deepEqual(scoped.entries.map((e) => e.text), ['gamma']);
    assert.ok(scoped.entries[0].recallCount >= 1);
    const recalled = nextEvent(client, 'memory/recalled');
    const res = await client.query({ text: 'alpha', limit: 1 }, { sessionId: 's-1' });
    const ev = await recalled;
    assert.equal(ev.sessionId, 's-1');
    assert.equal(res.entries.length, 1);
    assert.equal(ev.matches, 2); // the hit count (the query's total), not the entries
    const audit = await client.auditList({ limit: 1 });
    assert.equal(audit[0].action, 'recalled');
  });

  test('auditList: newest first, limit', async () => {
    await client.add({ ...UG, text: 'one' });
    await client.add({ ...UG, text: 'two' });
    const rows = await client.auditList();
    assert.ok(rows.length >= 2);
    assert.equal(rows[0].action, 'add');
    assert.equal(rows[0].text, 'two');
    assert.equal(rows[1].text, 'one');
    assert.ok(rows[0].seq > rows[1].seq);
    assert.match(rows[0].outcome, /^allowed-once/);
    assert.match(rows[0].outcome, /auto/);
    assert.equal(rows[0].sessionId, 's-1');
    assert.equal((await client.auditList({ limit: 1 })).length, 1);
  });

  test('auditVerify / auditExplain: the ledger proves the writes; one entry\'s life', async () => {
    const { entry } = await client.add({ ...UG, text: 'uses pnpm' });
    await client.replace({ ...UG, id: entry.id, text: 'uses pnpm, never npm' });
    const report = await client.auditVerify();
    assert.equal(report.ok, true);
    assert.deepEqual(report.problems, []);
    assert.equal(report.auditRows, 2);
    assert.equal(report.afterAuditSeq, 0);
    assert.match(report.head, /^[0-9a-f]{64}$/);
    const life = await client.auditExplain('PNPM');
    assert.equal(life.entryId, entry.id);
    assert.equal(life.current.text, 'uses pnpm, never npm');
    assert.deepEqual(life.events.map((e) => [e.action, e.text, e.sessionId]),
      [['add', 'uses pnpm', 's-1'], ['replace', 'uses pnpm, never npm', 's-1']]);
    assert.equal(life.events[0].askedBy.pid, process.pid);
    assert.equal(life.events[0].decision, null); // policy auto: nothing was asked
    assert.deepEqual(await client.auditExplain(entry.id), life);
    await assert.rejects(client.auditExplain('no such text'), (err) => {
      assert.ok(err instanceof MemorydError);
      assert.equal(err.code, 'INVALID_INPUT');
      assert.deepEqual(err.details, { field: 'target' });
      return true;
    });
  });

  test('snapshot: rendered once per session, frozen, memory/snapshot event', async () => {
    assert.equal((await client.snapshot(makeSession('s-empty'))).text, '');
    await client.add({ ...UG, text: 'prefers concise answers' });
    const ev = nextEvent(client, 'memory/snapshot');
    const snap = await client.snapshot();
    assert.match(snap.text, /frozen memory snapshot/);
    assert.match(snap.text, /- prefers concise answers/);
    assert.equal((await ev).sessionId, 's-1');
    await client.add({ ...UG, text: 'added later' });
    assert.equal((await client.snapshot()).text, snap.text);
    const zh = await client.snapshot(makeSession('s-zh'), { language: 'zh' });
    assert.notEqual(zh.text, snap.text);
  });

  test('export / import (envelope) / adapters', async () => {
    await client.add({ ...UG, text: 'exported fact', tags: ['x'] });
    const env = await client.export();
    assert.equal(env.schema, 'memory-export-v1');
    assert.equal(env.plugin, 'dsh-memento');
    assert.equal(typeof env.exportedAt, 'string');
    assert.equal(env.budgets.length, 4);
    assert.deepEqual(env.entries.map((e) => e.text), ['exported fact']);

    const imported = await client.import({ envelope: env });
    assert.equal(imported.added, 1);
    assert.deepEqual(imported.entries[0].tags, ['x']);
    assert.notEqual(imported.entries[0].id, env.entries[0].id);

    const adapters = await client.adaptersList();
    const ids = adapters.map((a) => a.id);
    for (const id of ['mem0', 'hermes-memory-md', 'claude-code-memory-md']) assert.ok(ids.includes(id), id);
    for (const a of adapters) {
      assert.equal(typeof a.name, 'string');
      assert.ok(Array.isArray(a.importFormats));
      assert.equal(typeof a.exportFormat, 'string');
    }
    const mem0 = await client.export({ adapter: 'mem0' });
    assert.equal(mem0.plugin, 'mem0');
    assert.equal(mem0.facts.length, 2);
    const viaAdapter = await client.import({ adapter: 'mem0', payload: { facts: [{ memory: 'from mem0', metadata: { category: 'c' } }] } });
    assert.equal(viaAdapter.added, 1);
    assert.equal(viaAdapter.entries[0].source, 'mem0');
    const md = await client.import({ adapter: 'hermes-memory-md', payload: '## Prefs\n- bullet one\n- bullet two\n' });
    assert.equal(md.added, 2);
  });

  test('proposals: create, list, approve, dismiss', async () => {
    const p = await client.proposalsCreate({ kind: 'compaction', ...UG, text: 'proposed memory' });
    assert.equal(p.status, 'pending');
    assert.equal(p.sessionId, 's-1');
    assert.equal(p.text, 'proposed memory');
    assert.equal(await client.proposalsCreate({ kind: 'compaction', ...UG, text: 'again' }), null);
    const p2 = await client.proposalsCreate({ kind: 'other', ...AW, text: 'second proposal' }, makeSession('s-2'));
    assert.equal(p2.sessionId, 's-2');
    assert.deepEqual((await client.proposalsList({ status: 'pending' })).map((x) => x.id).sort(), [p.id, p2.id].sort());
    assert.equal((await client.proposalsList()).length, 2);

    const approved = await client.proposalsApprove(p.id);
    assert.equal(approved.proposal.status, 'approved');
    assert.equal(approved.entry.text, 'proposed memory');
    assert.equal(approved.entry.source, 'proposal');
    assert.equal(approved.usage.used, 'proposed memory'.length);

    const dismissed = await client.proposalsDismiss(p2.id);
    assert.equal(dismissed.status, 'dismissed');
    assert.equal(typeof dismissed.decidedAt, 'number');
    const err = await client.proposalsDismiss(p2.id).catch((e) => e);
    assert.equal(err.code, 'PROPOSAL_NOT_FOUND');
    assert.equal(err.details.id, p2.id);
    assert.deepEqual(await client.proposalsList({ status: 'pending' }), []);
  });

  test('approvalSubscribe / approvalDecided (unknown id refused)', async () => {
    assert.deepEqual(await client.approvalSubscribe(), {});
    const err = await client.approvalDecided('00000000-0000-4000-8000-000000000000', 'allowed-once').catch((e) => e);
    assert.ok(err instanceof MemorydError);
    assert.equal(err.code, 'INVALID_INPUT');
  });

  test('status', async () => {
    await open();
    const st = await client.status();
    assert.equal(typeof st.version, 'string');
    assert.equal(typeof st.uptimeS, 'number');
    assert.ok(st.connections >= 2, `connections ${st.connections}`);
    assert.equal(st.pendingApprovals, 0);
    assert.equal(typeof st.queueDepth, 'number');
    assert.equal(st.store.schemaVersion, 4);
    assert.equal(st.store.path, daemon.dbPath);
  });

  test('generic call() and notify()', async () => {
    const st = await client.call('daemon/status');
    assert.equal(st.store.schemaVersion, 4);
    const rows = await client.call('memory/budgets', {}, { timeoutMs: 20_000 });
    assert.equal(rows.length, 4);
    // a notification gets no answer and does not disturb the connection
    client.notify('approval/decided', { id: 'nope', outcome: 'rejected' });
    assert.equal((await client.status()).pendingApprovals, 0);
  });

  test('onEvent option and off()', async () => {
    const seen = [];
    const c2 = await open({ onEvent: (method, params) => seen.push([method, params.entry?.text]) });
    const listener = () => seen.push(['listener']);
    c2.on('memory/added', listener);
    await c2.add({ ...UG, text: 'evented' });
    c2.off('memory/added', listener);
    await c2.add({ ...UG, text: 'evented 2' });
    await eventually(() => seen.length >= 3);
    assert.deepEqual(seen, [['listener'], ['memory/added', 'evented'], ['memory/added', 'evented 2']]);
  });

  test('write context: explicit session and write override the connection session', async () => {
    const a = await client.add({ ...UG, text: 'by s-2' }, { session: makeSession('s-2') });
    assert.equal(a.entry.sessionId, 's-2');
    const b = await client.add({ ...UG, text: 'by s-3' }, { write: { agent: { session: makeSession('s-3', { agentPreset: 'other' }) } } });
    assert.equal(b.entry.sessionId, 's-3');
    const err = await client.add({ ...UG, text: 'x' }, { write: null }).catch((e) => e);
    assert.equal(err.code, 'WRITE_REQUIRES_AGENT');
    const anon = await open({ session: undefined });
    const err2 = await anon.add({ ...UG, text: 'x' }).catch((e) => e);
    assert.equal(err2.code, 'WRITE_REQUIRES_AGENT');
    assert.equal(err2.rpcCode, -32010);
  });
  test('watch: another connection\'s writes of visible entries, with the writer\'s sessionId', async () => {
    const watcher = await open({ session: makeSession('w-1') });
    const writer = await open({ session: makeSession('s-2') });
    assert.deepEqual(await watcher.watch(), {});
    const seen = [];
    let wake;
    const enough = new Promise((resolve) => { wake = resolve; });
    for (const m of ['memory/added', 'memory/updated', 'memory/removed']) {
      watcher.on(m, (p) => {
        seen.push([m, p.entry.text, p.sessionId]);
        if (seen.length === 4) wake();
      });
    }
    // another workspace's entry: not for this watcher (the sentinel after it shows it never came)
    await writer.add({ ...AW, text: 'elsewhere' }, { session: makeSession('s-3', { cwd: '/tmp/mdjs-other' }) });
    await writer.add({ ...UG, text: 'prefers tabs' });
    await writer.replace({ ...UG, match: 'tabs', text: 'prefers spaces' });
    await writer.remove({ ...UG, match: 'spaces' });
    await writer.add({ ...AW, text: 'sentinel' });
    await enough;
    assert.deepEqual(seen, [
      ['memory/added', 'prefers tabs', 's-2'],
      ['memory/updated', 'prefers spaces', 's-2'],
      ['memory/removed', 'prefers spaces', 's-2'],
      ['memory/added', 'sentinel', 's-2'],
    ]);
    const err = await watcher.watch({ header: { cwd: '/tmp' } }).catch((e) => e);
    assert.equal(err.code, 'INVALID_INPUT');
  });
});
