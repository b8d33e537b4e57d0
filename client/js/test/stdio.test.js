// spawn(): the daemon as a child speaking NDJSON over stdin/stdout.

import { test, describe } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import path from 'node:path';

import { spawn, ConnectionFailedError, CONNECTION_CLOSED, CONNECTION_FAILED, WRITE_DENIED } from '../index.js';
import { pythonCommand, shortTempDir, stdioArgs, makeSession, nextEvent } from '../test-support/daemon.js';

const UG = { track: 'user', scope: 'user-global' };

describe('spawn() over stdio', () => {
  test('initialize, every kind of call, events, close() waits for exit', async () => {
    const dir = shortTempDir();
    try {
      const client = await spawn({
        command: pythonCommand(),
        args: stdioArgs({ db: path.join(dir, 'd.db'), policy: 'auto' }),
        env: { PYTHONUNBUFFERED: '1' },
        cwd: dir,
        stderr: 'pipe',
        session: makeSession('s-stdio'),
      });
      assert.equal(client.serverInfo.protocol, 'dsh-memory-protocol/v1');
      assert.equal(client.serverInfo.writePolicy, 'auto');
      assert.equal(typeof client.process.pid, 'number');
      const added = nextEvent(client, 'memory/added');
      const res = await client.add({ ...UG, text: 'over stdio: ünïcødé 记忆 😀' });
      assert.equal(res.entry.text, 'over stdio: ünïcødé 记忆 😀');
      assert.equal((await added).entry.id, res.entry.id);
      // many concurrent calls, responses routed by id
      const results = await Promise.all(Array.from({ length: 20 }, (_, i) => client.add({ ...UG, text: `bulk ${i}` })));
      assert.deepEqual(results.map((r) => r.entry.text), Array.from({ length: 20 }, (_, i) => `bulk ${i}`));
      const big = 'x'.repeat(1500);
      await client.add({ track: 'agent', scope: 'user-global', text: big });
      assert.equal((await client.list()).length, 22);
      assert.equal((await client.query({ text: 'BULK 1' })).total, 11);
      const st = await client.status();
      assert.equal(st.store.path, path.join(dir, 'd.db'));
      assert.equal((await client.call('nope/x').catch((e) => e)).code, 'METHOD_NOT_FOUND');
      const exit = await client.close();
      assert.deepEqual(exit, { code: 0, signal: null });
      assert.equal(client.closed, true);
      assert.equal((await client.status().catch((e) => e)).code, CONNECTION_CLOSED);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test('approval round trip over stdio (policy ask)', async () => {
    const dir = shortTempDir();
    try {
      const client = await spawn({
        command: pythonCommand(),
        args: stdioArgs({ db: path.join(dir, 'd.db'), policy: 'ask' }),
        cwd: dir,
        stderr: 'pipe',
        session: makeSession('s-stdio'),
        onApproval: (p) => (p.text.includes('yes') ? 'allowed-once' : 'rejected'),
      });
      assert.equal((await client.add({ ...UG, text: 'yes please' })).entry.text, 'yes please');
      const err = await client.add({ ...UG, text: 'no thanks' }).catch((e) => e);
      assert.equal(err.code, WRITE_DENIED);
      assert.equal(err.details.outcome, 'rejected');
      assert.deepEqual((await client.list()).map((e) => e.text), ['yes please']);
      assert.equal((await client.close()).code, 0);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test('pending calls are rejected when the child dies', async () => {
    const dir = shortTempDir();
    try {
      const client = await spawn({
        command: pythonCommand(),
        args: stdioArgs({ db: path.join(dir, 'd.db'), policy: 'ask' }),
        cwd: dir,
        stderr: 'pipe',
        session: makeSession(),
        onApproval: () => new Promise(() => {}),
      });
      const asked = nextEvent(client, 'approval/asked');
      const write = client.add({ ...UG, text: 'x' }).catch((e) => e);
      await asked;
      client.process.kill('SIGKILL');
      assert.equal((await write).code, CONNECTION_CLOSED);
      const exit = await client.close();
      assert.equal(exit.signal, 'SIGKILL');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test('a missing command → CONNECTION_FAILED', async () => {
    const err = await spawn({ command: '/nonexistent/memoryd', stderr: 'ignore' }).catch((e) => e);
    assert.ok(err instanceof ConnectionFailedError, String(err));
    assert.equal(err.code, CONNECTION_FAILED);
    assert.equal(err.details.errno, 'ENOENT');
  });

  test('a daemon that exits at start → CONNECTION_FAILED with its exit status and stderr', async () => {
    const err = await spawn({
      command: pythonCommand(),
      args: ['-c', 'import sys; sys.stderr.write("STORE_CORRUPT /x/memory.db\\n"); sys.exit(3)'],
      stderr: 'pipe',
    }).catch((e) => e);
    assert.equal(err.code, CONNECTION_FAILED);
    assert.equal(err.details.exit.code, 3);
    assert.match(err.details.stderr, /STORE_CORRUPT/);
    assert.match(err.message, /STORE_CORRUPT/);
  });
});
