// Unit tests without a daemon: NDJSON framing, message routing, error mapping, pending-call
// bookkeeping and the approval handler, against a fake in-memory peer.

import { test, describe } from 'node:test';
import assert from 'node:assert/strict';
import { PassThrough } from 'node:stream';

import {
  Client,
  LineDecoder,
  MemorydError,
  BudgetExceededError,
  MethodNotFoundError,
  ConnectionClosedError,
  CallTimeoutError,
  codeForRpcCode,
  encodeMessage,
  ERROR_CODES,
  BUDGET_EXCEEDED,
  CONNECTION_CLOSED,
  TIMEOUT,
  ABORTED,
  defaultSocketPath,
} from '../index.js';

/** A fake daemon on the other end of a Client: reads the client's lines, writes raw bytes back. */
function fakePeer(clientOpts = {}) {
  const toClient = new PassThrough();
  const fromClient = new PassThrough();
  const received = [];
  const waiters = [];
  const dec = new LineDecoder();
  fromClient.on('data', (chunk) => {
    for (const line of dec.push(chunk)) {
      const msg = JSON.parse(line);
      received.push(msg);
      for (const w of waiters.splice(0)) w();
    }
  });
  const client = new Client({ readable: toClient, writable: fromClient, ...clientOpts });
  return {
    client,
    received,
    /** Write raw text/bytes to the client. */
    raw: (data) => toClient.write(data),
    send: (msg) => toClient.write(encodeMessage(msg)),
    end: () => toClient.end(),
    /** Wait for the n-th message from the client (1-based) and return it. */
    async nth(n, timeoutMs = 2000) {
      const deadline = Date.now() + timeoutMs;
      while (received.length < n) {
        if (Date.now() > deadline) throw new Error(`only ${received.length} messages received`);
        await new Promise((r) => {
          waiters.push(r);
          setTimeout(r, 20);
        });
      }
      return received[n - 1];
    },
  };
}

describe('LineDecoder', () => {
  test('partial lines and multiple messages per chunk', () => {
    const d = new LineDecoder();
    assert.deepEqual(d.push(Buffer.from('{"a":1}\n{"b"')), ['{"a":1}']);
    assert.deepEqual(d.push(Buffer.from(':2}\n{"c":3}\n{"d":4}\n')), ['{"b":2}', '{"c":3}', '{"d":4}']);
    assert.deepEqual(d.push(Buffer.from('{"e"')), []);
    assert.deepEqual(d.push(Buffer.from(':5}')), []);
    assert.deepEqual(d.push(Buffer.from('\n')), ['{"e":5}']);
    assert.deepEqual(d.end(), []);
  });

  test('multi-byte UTF-8 split at every byte boundary', () => {
    const text = JSON.stringify({ text: 'héllo € 记忆 😀 end' }) + '\n';
    const bytes = Buffer.from(text, 'utf8');
    for (let i = 1; i < bytes.length; i++) {
      for (let j = i; j < bytes.length; j++) {
        const d = new LineDecoder();
        const out = [...d.push(bytes.subarray(0, i)), ...d.push(bytes.subarray(i, j)), ...d.push(bytes.subarray(j))];
        assert.deepEqual(out, [text.slice(0, -1)], `split at ${i},${j}`);
      }
    }
  });

  test('one byte at a time', () => {
    const msgs = [{ x: '😀😀' }, { y: 'ü' }, { z: [1, 2, 3] }];
    const bytes = Buffer.from(msgs.map((m) => JSON.stringify(m) + '\n').join(''));
    const d = new LineDecoder();
    const out = [];
    for (const b of bytes) out.push(...d.push(Buffer.from([b])));
    assert.deepEqual(out.map((l) => JSON.parse(l)), msgs);
  });

  test('CRLF, blank lines and an unterminated tail', () => {
    const d = new LineDecoder();
    assert.deepEqual(d.push('{"a":1}\r\n\n  \n{"b":2}'), ['{"a":1}']);
    assert.deepEqual(d.end(), ['{"b":2}']);
  });

  test('overlong lines are dropped, later lines kept', () => {
    let overflows = 0;
    const d = new LineDecoder({ maxLineBytes: 16, onOverflow: () => overflows++ });
    assert.deepEqual(d.push('{"a":"0123456789'), []);
    assert.deepEqual(d.push('0123456789"}\n{"b":1}\n'), ['{"b":1}']);
    assert.equal(overflows, 1);
  });

  test('encodeMessage is one line', () => {
    const line = encodeMessage({ text: 'a\nb\u2028c' });
    assert.equal(line.indexOf('\n'), line.length - 1);
  });
});

describe('Client routing (fake peer)', () => {
  test('responses are routed by id, out of order, across chunk boundaries', async () => {
    const p = fakePeer();
    const a = p.client.call('a/x', { n: 1 });
    const b = p.client.call('b/x');
    const ra = await p.nth(1);
    const rb = await p.nth(2);
    assert.equal(ra.jsonrpc, '2.0');
    assert.equal(ra.method, 'a/x');
    assert.deepEqual(ra.params, { n: 1 });
    assert.deepEqual(rb.params, {});
    const resp = encodeMessage({ jsonrpc: '2.0', id: rb.id, result: { v: 'b€' } }) + encodeMessage({ jsonrpc: '2.0', id: ra.id, result: { v: 'a' } });
    const buf = Buffer.from(resp);
    // split inside the euro sign
    const cut = buf.indexOf(Buffer.from('€')) + 1;
    p.raw(buf.subarray(0, cut));
    await new Promise((r) => setImmediate(r));
    p.raw(buf.subarray(cut));
    assert.deepEqual(await b, { v: 'b€' });
    assert.deepEqual(await a, { v: 'a' });
    assert.equal(p.client.pendingCount, 0);
  });

  test('notifications become events, onEvent and "notification"; batches are unpacked', async () => {
    const seen = [];
    const p = fakePeer({ onEvent: (m, params) => seen.push(['onEvent', m, params]) });
    p.client.on('memory/added', (params) => seen.push(['added', params]));
    p.client.on('notification', (m) => seen.push(['notification', m]));
    const call = p.client.call('x/y');
    const req = await p.nth(1);
    p.send([
      { jsonrpc: '2.0', method: 'memory/added', params: { entry: { id: 'e1' } } },
      { jsonrpc: '2.0', id: req.id, result: 42 },
    ]);
    assert.equal(await call, 42);
    assert.deepEqual(seen, [
      ['added', { entry: { id: 'e1' } }],
      ['notification', 'memory/added'],
      ['onEvent', 'memory/added', { entry: { id: 'e1' } }],
    ]);
  });

  test('a daemon → client request is answered METHOD_NOT_FOUND', async () => {
    const p = fakePeer();
    p.send({ jsonrpc: '2.0', id: 'srv-1', method: 'weird/thing', params: {} });
    const reply = await p.nth(1);
    assert.equal(reply.id, 'srv-1');
    assert.equal(reply.error.code, -32601);
    assert.equal(reply.error.data.code, 'METHOD_NOT_FOUND');
  });

  test('errors map to MemorydError subclasses with code, rpcCode, details', async () => {
    const p = fakePeer();
    const c1 = p.client.call('memory/add', {});
    const c2 = p.client.call('nope/x');
    const c3 = p.client.call('weird');
    const c4 = p.client.call('weird2');
    const [r1, r2, r3, r4] = [await p.nth(1), await p.nth(2), await p.nth(3), await p.nth(4)];
    const details = { track: 'user', scope: 'user-global', used: 90, limit: 100, needed: 150 };
    p.send({ jsonrpc: '2.0', id: r1.id, error: { code: -32011, message: 'memory budget exceeded', data: { code: 'BUDGET_EXCEEDED', message: 'memory budget exceeded', details } } });
    p.send({ jsonrpc: '2.0', id: r2.id, error: { code: -32601, message: 'Method not found' } });
    p.send({ jsonrpc: '2.0', id: r3.id, error: { code: -31999, message: 'odd' } });
    p.send({ jsonrpc: '2.0', id: r4.id, error: { code: -32013, message: 'ambiguous', data: { details: 'not-an-object' } } });
    const e1 = await c1.catch((e) => e);
    assert.ok(e1 instanceof BudgetExceededError);
    assert.ok(e1 instanceof MemorydError);
    assert.ok(e1 instanceof Error);
    assert.equal(e1.code, BUDGET_EXCEEDED);
    assert.equal(e1.rpcCode, -32011);
    assert.deepEqual(e1.details, details);
    assert.equal(e1.message, 'memory budget exceeded');
    assert.equal(e1.name, 'BudgetExceededError');
    const e2 = await c2.catch((e) => e);
    assert.ok(e2 instanceof MethodNotFoundError);
    assert.equal(e2.code, 'METHOD_NOT_FOUND');
    assert.deepEqual(e2.details, {});
    const e3 = await c3.catch((e) => e);
    assert.equal(e3.code, 'RPC_ERROR');
    assert.equal(e3.rpcCode, -31999);
    const e4 = await c4.catch((e) => e);
    assert.equal(e4.code, 'AMBIGUOUS_MATCH'); // derived from the JSON-RPC code
    assert.deepEqual(e4.details, {});
  });

  test('code table', () => {
    assert.equal(codeForRpcCode(-32602), 'INVALID_INPUT');
    assert.equal(codeForRpcCode(-32700), 'PARSE_ERROR');
    assert.equal(codeForRpcCode(-32600), 'INVALID_REQUEST');
    assert.equal(codeForRpcCode(-32603), 'INTERNAL_ERROR');
    for (const [name, rpc] of Object.entries(ERROR_CODES)) assert.equal(codeForRpcCode(rpc), name);
    assert.equal(Object.keys(ERROR_CODES).length, 13);
  });

  test('an error with id null is reported as an "error" event', async () => {
    const p = fakePeer();
    const got = new Promise((r) => p.client.once('error', r));
    p.send({ jsonrpc: '2.0', id: null, error: { code: -32700, message: 'Parse error', data: { code: 'PARSE_ERROR', details: {} } } });
    const err = await got;
    assert.equal(err.code, 'PARSE_ERROR');
  });

  test('invalid JSON from the peer does not break the stream', async () => {
    const p = fakePeer();
    const errors = [];
    p.client.on('error', (e) => errors.push(e));
    const call = p.client.call('a');
    const req = await p.nth(1);
    p.raw('this is not json\n');
    p.send({ jsonrpc: '2.0', id: req.id, result: 'ok' });
    assert.equal(await call, 'ok');
    assert.equal(errors.length, 1);
    assert.equal(errors[0].code, 'PROTOCOL_ERROR');
  });

  test('every pending call is rejected with CONNECTION_CLOSED when the peer ends', async () => {
    const p = fakePeer();
    const closes = [];
    p.client.on('close', (r) => closes.push(r));
    const calls = [p.client.call('a'), p.client.call('b'), p.client.add({ track: 'user', scope: 'user-global', text: 't' })];
    await p.nth(3);
    p.end();
    for (const c of calls) {
      const e = await c.catch((x) => x);
      assert.ok(e instanceof ConnectionClosedError, String(e));
      assert.equal(e.code, CONNECTION_CLOSED);
      assert.equal(e.rpcCode, null);
    }
    assert.equal(closes.length, 1);
    assert.equal(p.client.closed, true);
    const late = await p.client.call('c').catch((x) => x);
    assert.equal(late.code, CONNECTION_CLOSED);
    assert.throws(() => p.client.notify('x'), { code: CONNECTION_CLOSED });
  });

  test('close() rejects pending calls', async () => {
    const p = fakePeer();
    const c = p.client.call('a').catch((e) => e);
    await p.nth(1);
    await p.client.close();
    assert.equal((await c).code, CONNECTION_CLOSED);
  });

  test('timeouts: per call, default, and late responses are ignored', async () => {
    const p = fakePeer({ timeoutMs: 60 });
    const t0 = Date.now();
    const e = await p.client.call('slow', {}, { timeoutMs: 30 }).catch((x) => x);
    assert.ok(e instanceof CallTimeoutError);
    assert.equal(e.code, TIMEOUT);
    assert.equal(e.details.method, 'slow');
    assert.equal(e.details.timeoutMs, 30);
    assert.ok(Date.now() - t0 >= 25);
    const e2 = await p.client.call('slow2').catch((x) => x);
    assert.equal(e2.code, TIMEOUT);
    assert.equal(e2.details.timeoutMs, 60);
    // a late answer is dropped silently
    p.send({ jsonrpc: '2.0', id: (await p.nth(1)).id, result: 1 });
    // writes use writeTimeoutMs, not timeoutMs
    const p2 = fakePeer({ timeoutMs: 10, writeTimeoutMs: 200 });
    const w = p2.client.add({ track: 'user', scope: 'user-global', text: 'x' });
    await new Promise((r) => setTimeout(r, 50));
    const req = await p2.nth(1);
    p2.send({ jsonrpc: '2.0', id: req.id, result: { ok: true } });
    assert.deepEqual(await w, { ok: true });
    assert.equal(p.client.pendingCount, 0);
  });

  test('params must be structured: primitives are refused locally, null/undefined become {}', async () => {
    const p = fakePeer();
    const e = await p.client.call('a', 'str').catch((x) => x);
    assert.equal(e.code, 'INVALID_REQUEST');
    assert.equal(p.client.pendingCount, 0);
    p.client.call('b', null).catch(() => {});
    p.client.call('c', [1, 2]).catch(() => {});
    assert.deepEqual((await p.nth(1)).params, {});
    assert.deepEqual((await p.nth(2)).params, [1, 2]);
    await p.client.close();
  });

  test('AbortSignal cancels waiting', async () => {
    const p = fakePeer();
    const ac = new AbortController();
    const c = p.client.call('a', {}, { signal: ac.signal });
    ac.abort();
    assert.equal((await c.catch((e) => e)).code, ABORTED);
    assert.equal(p.client.pendingCount, 0);
  });

  test('write context: session default, explicit session, explicit write, none', async () => {
    const session = { id: 's-1', header: { cwd: '/p', agentPreset: 'coder' } };
    const p = fakePeer({ session });
    p.client.add({ track: 'user', scope: 'user-global', text: 'a' }).catch(() => {});
    p.client.seed([{ track: 'user', scope: 'user-global', text: 'b' }], { session: { id: 's-2' } }).catch(() => {});
    p.client.remove({ track: 'user', scope: 'user-global', match: 'a' }, { write: null }).catch(() => {});
    p.client.import({ envelope: { schema: 'x' } }).catch(() => {});
    p.client.proposalsApprove('p-1').catch(() => {});
    const [m1, m2, m3, m4, m5] = [await p.nth(1), await p.nth(2), await p.nth(3), await p.nth(4), await p.nth(5)];
    assert.deepEqual(m1.params, { input: { track: 'user', scope: 'user-global', text: 'a' }, write: { agent: { session } } });
    assert.deepEqual(m2.params.write, { agent: { session: { id: 's-2' } } });
    assert.equal(m2.method, 'memory/seed');
    assert.equal(m3.params.write, null);
    assert.deepEqual(m4.params, { envelope: { schema: 'x' }, write: { agent: { session } } });
    assert.deepEqual(m5.params, { id: 'p-1', write: { agent: { session } } });
    const q = fakePeer();
    q.client.add({ track: 'user', scope: 'user-global', text: 'a' }).catch(() => {});
    assert.equal('write' in (await q.nth(1)).params, false);
    await p.client.close();
    await q.client.close();
  });

  test('method names and params on the wire', async () => {
    const session = { id: 's-9' };
    const p = fakePeer({ session });
    const c = p.client;
    const calls = [
      [() => c.query({ text: 'x' }, { sessionId: 's-9' }), 'memory/query', { filter: { text: 'x' }, opts: { sessionId: 's-9' } }],
      [() => c.query(), 'memory/query', { opts: { sessionId: 's-9', agentKey: '', workspaceKey: '' } }],
      [() => c.query(undefined, null), 'memory/query', { opts: null }],
      [() => c.budgets(), 'memory/budgets', {}],
      [() => c.list(), 'memory/list', {}],
      [() => c.auditList({ limit: 5 }), 'audit/list', { limit: 5 }],
      [() => c.auditVerify(), 'audit/verify', {}],
      [() => c.auditExplain('tabs'), 'audit/explain', { target: 'tabs' }],
      [() => c.snapshot(undefined, { language: 'zh' }), 'memory/snapshot', { language: 'zh', session }],
      [() => c.export({ adapter: 'mem0' }), 'memory/export', { adapter: 'mem0' }],
      [() => c.adaptersList(), 'adapters/list', {}],
      [() => c.proposalsCreate({ kind: 'k', track: 'user', scope: 'user-global', text: 't' }), 'proposals/create', { input: { kind: 'k', track: 'user', scope: 'user-global', text: 't' }, session }],
      [() => c.proposalsList({ status: 'pending' }), 'proposals/list', { status: 'pending' }],
      [() => c.proposalsDismiss('p1'), 'proposals/dismiss', { id: 'p1' }],
      [() => c.approvalDecided('a1', 'rejected'), 'approval/decided', { id: 'a1', outcome: 'rejected' }],
      [() => c.approvalSubscribe(), 'approval/subscribe', {}],
      [() => c.status(), 'daemon/status', {}],
      [() => c.replace({ track: 'user', scope: 'user-global', match: 'a', text: 'b' }), 'memory/replace', { input: { track: 'user', scope: 'user-global', match: 'a', text: 'b' }, write: { agent: { session } } }],
      [() => c.consolidate({ track: 'user', scope: 'user-global', matches: ['a'], text: 'b' }), 'memory/consolidate', { input: { track: 'user', scope: 'user-global', matches: ['a'], text: 'b' }, write: { agent: { session } } }],
      [() => c.import({ adapter: 'mem0', payload: [] }), 'memory/import', { adapter: 'mem0', payload: [], write: { agent: { session } } }],
    ];
    let n = 0;
    for (const [fn, method, params] of calls) {
      fn().catch(() => {});
      const m = await p.nth(++n);
      assert.equal(m.method, method);
      assert.deepEqual(m.params, params, method);
    }
    p.client.notify('approval/decided', { id: 'z', outcome: 'rejected' });
    const note = await p.nth(++n);
    assert.equal('id' in note, false);
    await c.close();
  });

  test('initialize sends protocol, client info and capabilities', async () => {
    const p = fakePeer({ capabilities: { approvals: false }, clientInfo: { name: 'harness', version: '9' } });
    const init = p.client.initialize();
    const m = await p.nth(1);
    assert.deepEqual(m.params, { protocol: 'dsh-memory-protocol/v1', client: { name: 'harness', version: '9' }, capabilities: { approvals: false } });
    const result = { protocol: 'dsh-memory-protocol/v1', server: { name: 'memoryd', version: '0' }, schemaVersion: 4, writePolicy: 'ask', budgets: [] };
    p.send({ jsonrpc: '2.0', id: m.id, result });
    assert.deepEqual(await init, result);
    assert.deepEqual(p.client.serverInfo, result);
    const q = fakePeer();
    q.client.initialize().catch(() => {});
    assert.deepEqual((await q.nth(1)).params.capabilities, { approvals: true });
    await p.client.close();
    await q.client.close();
  });

  test('default socket path', () => {
    assert.equal(defaultSocketPath({ XDG_RUNTIME_DIR: '/run/user/7' }), '/run/user/7/memoryd/memoryd.sock');
    assert.match(defaultSocketPath({}), /\/memoryd-\d+\/memoryd\.sock$/);
    // MEMORYD_SOCKET wins, as for the daemon and memoryctl
    assert.equal(defaultSocketPath({ MEMORYD_SOCKET: '/x/m.sock', XDG_RUNTIME_DIR: '/run/user/7' }), '/x/m.sock');
  });
});

describe('approval handler (fake peer)', () => {
  const asked = (id) => ({ jsonrpc: '2.0', method: 'approval/asked', params: { id, action: 'add', track: 'user', scope: 'user-global', text: 't', source: 'dsh-memento', sessionId: 's', reason: 'r' } });

  async function decision(p, n) {
    const m = await p.nth(n);
    assert.equal(m.method, 'approval/decided');
    p.send({ jsonrpc: '2.0', id: m.id, result: {} });
    return m.params;
  }

  test('no handler → rejected (fail closed)', async () => {
    const p = fakePeer();
    p.send(asked('a1'));
    assert.deepEqual(await decision(p, 1), { id: 'a1', outcome: 'rejected' });
    await p.client.close();
  });

  test('handler outcome strings and booleans', async () => {
    const answers = { a1: 'allowed-once', a2: true, a3: false, a4: undefined, a5: 'cancelled' };
    const p = fakePeer({ onApproval: async (payload) => answers[payload.id] });
    let n = 0;
    const got = {};
    for (const id of Object.keys(answers)) {
      p.send(asked(id));
      const d = await decision(p, ++n);
      got[d.id] = d.outcome;
    }
    assert.deepEqual(got, { a1: 'allowed-once', a2: 'allowed-once', a3: 'rejected', a4: 'rejected', a5: 'cancelled' });
    await p.client.close();
  });

  test('a throwing handler → rejected, reported as an error event', async () => {
    const errors = [];
    const p = fakePeer({
      onApproval: () => {
        throw new Error('boom');
      },
    });
    p.client.on('error', (e) => errors.push(e.message));
    p.send(asked('a1'));
    assert.deepEqual(await decision(p, 1), { id: 'a1', outcome: 'rejected' });
    assert.deepEqual(errors, ['boom']);
    await p.client.close();
  });

  test('approval/resolved while the handler runs: signal aborted, no decision sent', async () => {
    let sawAbort = false;
    let release;
    const p = fakePeer({
      onApproval: (payload, { signal }) =>
        new Promise((resolve) => {
          signal.addEventListener('abort', () => {
            sawAbort = true;
          });
          release = () => resolve('allowed-once');
        }),
    });
    const resolvedEvents = [];
    p.client.on('approval/resolved', (x) => resolvedEvents.push(x));
    p.send(asked('a1'));
    await new Promise((r) => setTimeout(r, 20));
    p.send({ jsonrpc: '2.0', method: 'approval/resolved', params: { id: 'a1', outcome: 'allowed-once' } });
    await new Promise((r) => setTimeout(r, 20));
    release();
    await new Promise((r) => setTimeout(r, 50));
    assert.equal(sawAbort, true);
    assert.deepEqual(resolvedEvents, [{ id: 'a1', outcome: 'allowed-once' }]);
    assert.equal(p.received.length, 0);
    await p.client.close();
  });

  test('a refused decision (INVALID_INPUT) is swallowed', async () => {
    const errors = [];
    const p = fakePeer({ onApproval: () => 'allowed-once' });
    p.client.on('error', (e) => errors.push(e));
    p.send(asked('a1'));
    const m = await p.nth(1);
    p.send({ jsonrpc: '2.0', id: m.id, error: { code: -32602, message: 'unknown approval id', data: { code: 'INVALID_INPUT', details: {} } } });
    await new Promise((r) => setTimeout(r, 30));
    assert.deepEqual(errors, []);
    await p.client.close();
  });
});
