// Failures that name the next step: a daemon command that is not there, and an ambiguous
// match that names its candidates by id.

import { test, describe, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { connect, spawn, AmbiguousMatchError, ConnectionFailedError, CONNECTION_FAILED } from '../index.js';
import { startDaemon, makeSession, shortTempDir } from '../test-support/daemon.js';

const UG = { track: 'user', scope: 'user-global' };
const INDEX = fileURLToPath(new URL('../index.js', import.meta.url));
const NOT_ON_PATH =
  "cannot start memoryd: the command 'memoryd' was not found on PATH; install memoryd or pass its path as the " +
  "memoryd option (connect({ memoryd: '/path/to/memoryd' }))";

/** Run `script` (an ES module) with node, PATH holding node's own directory only. */
function runNode(script, dir) {
  const file = path.join(dir, 'user-script.mjs');
  writeFileSync(file, script);
  return new Promise((resolve) => {
    execFile(process.execPath, [file], { env: { PATH: path.dirname(process.execPath), HOME: dir }, cwd: dir },
      (error, stdout, stderr) => resolve({ code: error?.code ?? 0, stdout: String(stdout), stderr: String(stderr) }));
  });
}

describe('a daemon command that is not there', () => {
  const dir = shortTempDir();
  after(() => rmSync(dir, { recursive: true, force: true }));

  test('autostart without memoryd on PATH: one line naming the memoryd option; the user sees their own frames only', async () => {
    const socketPath = path.join(dir, 'run', 'memoryd.sock');
    const script = `import { connect } from ${JSON.stringify(INDEX)};
try {
  await connect({ socketPath: ${JSON.stringify(socketPath)}, autostart: true });
} catch (err) {
  console.log(JSON.stringify({ name: err.name, code: err.code, message: err.message, stack: err.stack,
    errno: err.details.errno, cause: err.cause === undefined }));
}
await connect({ socketPath: ${JSON.stringify(socketPath)}, autostart: true });
`;
    const r = await runNode(script, dir);
    const caught = JSON.parse(r.stdout.trim());
    assert.deepEqual(
      { name: caught.name, code: caught.code, message: caught.message, errno: caught.errno, cause: caught.cause },
      { name: 'ConnectionFailedError', code: CONNECTION_FAILED, message: NOT_ON_PATH, errno: 'ENOENT', cause: true },
    );
    // the stack: the message line, then only the user's script (none of the client's frames, none of node's)
    const [head, ...frames] = caught.stack.split('\n');
    assert.equal(head, `ConnectionFailedError: ${NOT_ON_PATH}`);
    assert.ok(frames.length > 0 && frames.every((f) => f.includes('user-script.mjs')), caught.stack);
    // uncaught: node prints that one line (and the error's fields), no "spawn memoryd ENOENT" cause
    assert.equal(r.code, 1);
    assert.ok(r.stderr.includes(`ConnectionFailedError: ${NOT_ON_PATH}\n`), r.stderr);
    assert.doesNotMatch(r.stderr, /spawn memoryd ENOENT|connect\.js|\[cause\]/);
    assert.equal(existsSync(path.join(dir, 'run')), false); // nothing was started, nothing made
  });

  test('autostart with a memoryd path that does not exist says so', async () => {
    const missing = path.join(dir, 'no-such-memoryd');
    const err = await connect({ socketPath: path.join(dir, 'm.sock'), autostart: true, memoryd: missing }).catch((e) => e);
    assert.ok(err instanceof ConnectionFailedError);
    assert.equal(err.message, `cannot start memoryd: the command '${missing}' does not exist; install memoryd or pass ` +
      "its path as the memoryd option (connect({ memoryd: '/path/to/memoryd' }))");
    assert.equal(err.stack.split('\n')[0], `ConnectionFailedError: ${err.message}`);
    assert.doesNotMatch(err.stack, /connect\.js/);
  });

  test('spawn() of a command that does not exist names the command option', async () => {
    const missing = path.join(dir, 'no-such-memoryd');
    const err = await spawn({ command: missing }).catch((e) => e);
    assert.equal(err.code, CONNECTION_FAILED);
    assert.equal(err.message, `cannot start memoryd: the command '${missing}' does not exist; install memoryd or pass ` +
      "its path as the command option (spawn({ command: '/path/to/memoryd' }))");
    assert.equal(err.details.errno, 'ENOENT');
  });
});

describe('an ambiguous match names its candidates', () => {
  test('AMBIGUOUS_MATCH: details.ids holds every candidate id; the message their short ids and how to name one', async () => {
    const daemon = await startDaemon({ policy: 'auto' });
    const client = await connect({ socketPath: daemon.socketPath, session: makeSession() });
    try {
      const ids = [];
      for (let n = 0; n < 3; n++) ids.push((await client.add({ ...UG, text: 'metric' })).entry.id);
      const err = await client.replace({ ...UG, match: 'metric', text: 'new' }).catch((e) => e);
      assert.ok(err instanceof AmbiguousMatchError);
      assert.deepEqual([...err.details.ids].sort(), [...ids].sort());
      const shown = err.details.ids.map((id) => id.slice(0, 8)).join(', ');
      assert.equal(err.message, `match is ambiguous: 3 entries contain it (ids ${shown}); name one with its id ` +
        '(memoryctl: --id ID; details.ids has the full ids) or use a longer substring');
      // naming one by its id works, and the other two are unchanged
      await client.replace({ ...UG, id: err.details.ids[0], text: 'new' });
      assert.deepEqual((await client.list()).map((e) => e.text).sort(), ['metric', 'metric', 'new']);
    } finally {
      await client.close();
      await daemon.stop();
    }
  });
});
