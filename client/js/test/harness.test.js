// The Node client as a harness uses it: query scoped to the connection's session, approval
// handlers told which call asked (approval/asked.requestId), and connect() that waits for a
// starting daemon or starts one itself.

import { test, describe, beforeEach, afterEach } from 'node:test';
import assert from 'node:assert/strict';
import { PassThrough } from 'node:stream';
import { execFileSync, spawn as spawnChild } from 'node:child_process';
import { existsSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';

import {
  Client,
  LineDecoder,
  connect,
  encodeMessage,
  CONNECTION_FAILED,
  ENTRY_NOT_FOUND,
  AUTOSTART_LOG,
} from '../index.js';
import { startDaemon, pythonCommand, daemonEnv, shortTempDir, nextEvent } from '../test-support/daemon.js';

const UG = { track: 'user', scope: 'user-global' };
const AW = { track: 'agent', scope: 'workspace' };
const A = { id: 's-a', header: { cwd: '/home/u/a', agentPreset: 'coder' } };
const B = { id: 's-b', header: { cwd: '/home/u/b', agentPreset: 'reviewer' } };
const MEMORYD = () => [pythonCommand(), '-m', 'memoryd'];

/** A fake daemon on the other end of a Client; `next()` resolves with the client's next message. */
function fakePeer(clientOpts = {}) {
  const toClient = new PassThrough();
  const fromClient = new PassThrough();
  const queue = [];
  const waiters = [];
  const dec = new LineDecoder();
  fromClient.on('data', (chunk) => {
    for (const line of dec.push(chunk)) {
      const msg = JSON.parse(line);
      const w = waiters.shift();
      if (w) w(msg);
      else queue.push(msg);
    }
  });
  const client = new Client({ readable: toClient, writable: fromClient, ...clientOpts });
  return {
    client,
    send: (msg) => toClient.write(encodeMessage(msg)),
    next: () => (queue.length ? Promise.resolve(queue.shift()) : new Promise((r) => waiters.push(r))),
  };
}

const asked = (id, extra = {}) => ({
  jsonrpc: '2.0',
  method: 'approval/asked',
  params: { id, action: 'add', track: 'user', scope: 'user-global', text: 't', source: 'dsh-memento', sessionId: 's', reason: 'r', ...extra },
});

function texts(result) {
  return new Set(result.entries.map((e) => e.text));
}

// --- query opts (no daemon) -------------------------------------------------------------------

describe('query defaults to the session (fake peer)', () => {
  test('the wire opts a session implies', async () => {
    const cases = [
      [A, { sessionId: 's-a', agentKey: 'coder', workspaceKey: '/home/u/a' }],
      [{ header: { cwd: '/p', agentPreset: 'x' } }, { agentKey: 'x', workspaceKey: '/p' }], // no id: no recalled row
      [{ id: 's-1' }, { sessionId: 's-1', agentKey: '', workspaceKey: '' }], // no header: shared layer, no workspace
      [{ id: 's-2', header: { cwd: null, agentPreset: null } }, { sessionId: 's-2', agentKey: '', workspaceKey: '' }],
      [undefined, undefined],
    ];
    for (const [session, opts] of cases) {
      const p = fakePeer({ session });
      assert.deepEqual(p.client.queryOpts, opts);
      p.client.query({ text: 'x' }).catch(() => {});
      const m = await p.next();
      assert.deepEqual(m.params, opts === undefined ? { filter: { text: 'x' } } : { filter: { text: 'x' }, opts });
      await p.client.close();
    }
  });

  test('explicit opts override; null and {} mean the whole store', async () => {
    const p = fakePeer({ session: A });
    for (const [opts, wire] of [
      [{ agentKey: 'reviewer' }, { opts: { agentKey: 'reviewer' } }],
      [{}, { opts: {} }],
      [null, { opts: null }],
    ]) {
      p.client.query(undefined, opts).catch(() => {});
      assert.deepEqual((await p.next()).params, wire);
    }
    await p.client.close();
  });
});

// --- approval handler told which call asked (no daemon) ----------------------------------------

describe('approval handler gets the asking call (fake peer)', () => {
  test('requestId of an in-flight call: its method and params', async () => {
    const seen = [];
    const p = fakePeer({
      session: A,
      onApproval: (payload, ctx) => {
        seen.push({ payload, requestId: ctx.requestId, method: ctx.method, params: ctx.params, signal: ctx.signal instanceof AbortSignal });
        return true;
      },
    });
    p.client.add({ ...UG, text: 'one' }).catch(() => {});
    p.client.remove({ ...UG, id: 'e-1' }).catch(() => {});
    const add = await p.next();
    const remove = await p.next();
    p.send(asked('ap-2', { requestId: remove.id, action: 'remove' }));
    p.send(asked('ap-1', { requestId: add.id }));
    const decisions = [await p.next(), await p.next()];
    assert.deepEqual(decisions.map((d) => [d.method, d.params]), [
      ['approval/decided', { id: 'ap-2', outcome: 'allowed-once' }],
      ['approval/decided', { id: 'ap-1', outcome: 'allowed-once' }],
    ]);
    assert.deepEqual(seen.map((s) => [s.payload.id, s.requestId, s.method, s.params, s.signal]), [
      ['ap-2', remove.id, 'memory/remove', { input: { ...UG, id: 'e-1' }, write: { agent: { session: A } } }, true],
      ['ap-1', add.id, 'memory/add', { input: { ...UG, text: 'one' }, write: { agent: { session: A } } }, true],
    ]);
    await p.client.close();
  });

  test('an ask that names no call of this connection: no requestId, method or params', async () => {
    const ctxs = [];
    const p = fakePeer({
      onApproval: (payload, ctx) => {
        ctxs.push(Object.keys(ctx).sort());
        return 'rejected';
      },
    });
    p.client.status().catch(() => {});
    const status = await p.next();
    for (const [n, extra] of [[1, {}], [2, { requestId: status.id + 100 }], [3, { requestId: null }], [4, { requestId: String(status.id) }]]) {
      p.send(asked(`ap-${n}`, extra));
      assert.deepEqual((await p.next()).params, { id: `ap-${n}`, outcome: 'rejected' });
    }
    assert.deepEqual(ctxs, Array(4).fill(['client', 'signal']));
    await p.client.close();
  });
});

// --- against a real daemon ----------------------------------------------------------------------

describe('query scoped to the session (real daemon)', () => {
  let daemon;
  const clients = [];
  const open = async (opts) => {
    const c = await connect({ socketPath: daemon.socketPath, ...opts });
    clients.push(c);
    return c;
  };
  beforeEach(async () => {
    daemon = await startDaemon({ policy: 'auto' });
  });
  afterEach(async () => {
    for (const c of clients.splice(0)) await c.close();
    await daemon.stop();
  });

  test('two sessions see only their visible sets; explicit opts override', async () => {
    const a = await open({ session: A });
    const b = await open({ session: B });
    const entries = {};
    for (const [c, input] of [
      [a, { ...UG, text: 'a private' }],
      [a, { ...UG, text: 'shared global', agentKey: '' }],
      [a, { ...AW, text: 'a workspace' }],
      [b, { ...UG, text: 'b private' }],
      [b, { ...AW, text: 'b workspace' }],
      [b, { ...AW, text: 'b workspace shared', agentKey: '' }],
    ]) {
      entries[input.text] = (await c.add(input)).entry;
    }
    const recalled = nextEvent(a, 'memory/recalled');
    assert.deepEqual(texts(await a.query()), new Set(['a private', 'shared global', 'a workspace']));
    assert.equal((await recalled).sessionId, 's-a');
    assert.deepEqual(texts(await b.query()), new Set(['shared global', 'b private', 'b workspace', 'b workspace shared']));
    assert.deepEqual(texts(await b.query({ track: 'agent' })), new Set(['b workspace', 'b workspace shared']));
    const rows = (await a.auditList({ limit: 10 })).filter((r) => r.action === 'recalled');
    assert.deepEqual(rows.map((r) => r.sessionId), ['s-b', 's-b', 's-a']);

    assert.equal((await a.query(undefined, null)).total, 6);
    assert.equal((await a.query(undefined, {})).total, 6);
    assert.deepEqual(texts(await a.query(undefined, { agentKey: 'reviewer', workspaceKey: '/home/u/b' })), texts(await b.query()));

    // what a session cannot query it cannot target either: the id of b's private entry
    const before = await a.list();
    const err = await a.remove({ ...UG, id: entries['b private'].id }).catch((e) => e);
    assert.equal(err.code, ENTRY_NOT_FOUND);
    assert.deepEqual(err.details, { ...UG, entryId: entries['b private'].id });
    assert.deepEqual(await a.list(), before);
  });
});

/** `memoryd serve --socket socketPath` as a plain child: no readiness polling here, the client under test waits. */
function serve(socketPath, db, extra = []) {
  const proc = spawnChild(pythonCommand(), ['-m', 'memoryd', 'serve', '--socket', socketPath, '--db', db, '--write-policy', 'auto', ...extra], {
    cwd: '/',
    env: daemonEnv(),
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  proc.stderr.resume();
  const exited = new Promise((resolve) => proc.once('exit', (code, signal) => resolve({ code, signal })));
  return { proc, exited };
}

/** Stop a daemon that is not our child: SIGTERM, then wait for its connection to close. */
async function stopDetached(client, pid) {
  const closed = nextEvent(client, 'close', 10_000);
  process.kill(pid, 'SIGTERM');
  await closed;
}

describe('connect: wait for a starting daemon, or start one', () => {
  let dir;
  const cleanups = [];
  beforeEach(() => {
    dir = shortTempDir('mdjw-');
  });
  afterEach(async () => {
    for (const fn of cleanups.splice(0).reverse()) await fn();
    rmSync(dir, { recursive: true, force: true });
  });

  test('wait: connects as soon as the daemon comes up, even in a directory that does not exist yet', async () => {
    const socketPath = path.join(dir, 'run', 'sub', 'memoryd.sock');
    const connecting = connect({ socketPath, wait: 30_000, session: A });
    const { proc, exited } = serve(socketPath, path.join(dir, 'd.db'));
    cleanups.push(async () => {
      proc.kill('SIGTERM');
      await exited;
    });
    const client = await connecting;
    cleanups.unshift(() => client.close());
    assert.equal(client.serverInfo.protocol, 'dsh-memory-protocol/v1');
    assert.equal((await client.add({ ...UG, text: 'waited' })).entry.text, 'waited');
  });

  test('wait: gives up at the deadline with CONNECTION_FAILED (no socket, or a stale one)', async () => {
    const missing = path.join(dir, 'none.sock');
    const started = Date.now();
    const err = await connect({ socketPath: missing, wait: 300 }).catch((e) => e);
    assert.ok(Date.now() - started >= 300);
    assert.equal(err.code, CONNECTION_FAILED);
    assert.equal(err.details.errno, 'ENOENT');
    assert.equal(err.details.waitMs, 300);
    assert.match(err.message, /^cannot connect to memoryd at .*none\.sock: .* \(waited 300 ms\)$/);

    // a socket file nobody listens on, as a killed daemon leaves one: ECONNREFUSED, also retried
    const stale = path.join(dir, 'stale.sock');
    execFileSync(pythonCommand(), ['-c', 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])', stale]);
    const err2 = await connect({ socketPath: stale, wait: 200 }).catch((e) => e);
    assert.equal(err2.code, CONNECTION_FAILED);
    assert.equal(err2.details.errno, 'ECONNREFUSED');
  });

  test('without wait or autostart, a missing daemon fails at once', async () => {
    const err = await connect({ socketPath: path.join(dir, 'none.sock') }).catch((e) => e);
    assert.equal(err.code, CONNECTION_FAILED);
    assert.equal(err.details.errno, 'ENOENT');
    assert.doesNotMatch(err.message, /waited/);
  });

  test('autostart: spawns memoryd detached with its log next to the socket; the next client reuses it', async () => {
    const socketPath = path.join(dir, 'run', 'memoryd.sock');
    const db = path.join(dir, 'auto.db');
    const opts = { socketPath, autostart: true, memoryd: MEMORYD(), db, autostartArgs: ['--write-policy', 'auto'], session: A, wait: 30_000 };
    const first = await connect(opts);
    assert.equal(typeof first.autostartedPid, 'number');
    cleanups.push(() => stopDetached(first, first.autostartedPid));
    assert.equal((await first.status()).store.path, db);
    assert.equal(first.serverInfo.writePolicy, 'auto');
    assert.ok(existsSync(path.join(dir, 'run', AUTOSTART_LOG)));
    const second = await connect(opts);
    cleanups.unshift(() => second.close());
    assert.equal(second.autostartedPid, undefined); // it answered: nothing spawned
    await second.add({ ...UG, text: 'shared daemon' });
    assert.deepEqual((await first.list()).map((e) => e.text), ['shared daemon']);
  });

  test('autostart: clients starting at the same moment spawn one daemon', async () => {
    const socketPath = path.join(dir, 'memoryd.sock');
    const opts = { socketPath, autostart: true, memoryd: MEMORYD(), db: path.join(dir, 'race.db'), autostartArgs: ['--write-policy', 'auto'], wait: 30_000 };
    const clients = await Promise.all([connect(opts), connect(opts), connect(opts)]);
    const starters = clients.filter((c) => c.autostartedPid !== undefined);
    assert.equal(starters.length, 1);
    const [starter] = starters;
    cleanups.push(() => stopDetached(starter, starter.autostartedPid));
    for (const c of clients) if (c !== starter) cleanups.unshift(() => c.close());
    assert.equal((await starter.status()).connections, 3);
  });

  test('autostart: a daemon that cannot start is CONNECTION_FAILED with its stderr; the store is untouched', async () => {
    const socketPath = path.join(dir, 'memoryd.sock');
    const db = path.join(dir, 'corrupt.db');
    const junk = 'this is not an SQLite database'.repeat(100);
    writeFileSync(db, junk);
    const err = await connect({ socketPath, autostart: true, memoryd: MEMORYD(), db, wait: 30_000 }).catch((e) => e);
    assert.equal(err.code, CONNECTION_FAILED);
    // the daemon's one-line reason is in the message, not only in details
    assert.equal(err.message, `memoryd exited with 1 before it was ready: STORE_CORRUPT: store is not an SQLite database: ${db} (log: ${path.join(dir, AUTOSTART_LOG)})`);
    assert.equal(err.details.exit.code, 1);
    assert.match(err.details.stderr, /STORE_CORRUPT/);
    assert.match(readFileSync(path.join(dir, AUTOSTART_LOG), 'utf8'), /STORE_CORRUPT/);
    assert.equal(readFileSync(db, 'utf8'), junk);
  });

  test('autostart: a command that does not exist fails with CONNECTION_FAILED', async () => {
    const missing = path.join(dir, 'no-such-memoryd');
    const err = await connect({ socketPath: path.join(dir, 'm.sock'), autostart: true, memoryd: missing }).catch((e) => e);
    assert.equal(err.code, CONNECTION_FAILED);
    assert.equal(err.message, `cannot start memoryd: the command '${missing}' does not exist; install memoryd or pass ` +
      "its path as the memoryd option (connect({ memoryd: '/path/to/memoryd' }))");
  });
});
