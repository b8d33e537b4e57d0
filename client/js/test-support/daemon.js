// Test support: start a real memoryd on a short temporary socket path and stop it again.
// (Kept outside test/ because `node --test test/` runs every .js file under test/.)

import { spawn as spawnChild } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const repoRoot = path.resolve(here, '..', '..', '..');

/** MEMORYD_PYTHON, else the repo's .venv python, else python3. */
export function pythonCommand() {
  if (process.env.MEMORYD_PYTHON) return process.env.MEMORYD_PYTHON;
  for (const p of [path.join(repoRoot, '.venv', 'bin', 'python'), '/work/main/.venv/bin/python']) {
    if (existsSync(p)) return p;
  }
  return 'python3';
}

export function daemonEnv(extra = {}) {
  return { ...process.env, PYTHONUNBUFFERED: '1', ...extra };
}

/** A short temp dir under /tmp (Unix socket paths must stay under ~100 bytes). */
export function shortTempDir(prefix = 'mdjs-') {
  return mkdtempSync(path.join('/tmp', prefix));
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function tryConnect(socketPath) {
  return new Promise((resolve) => {
    const s = net.createConnection({ path: socketPath });
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });
}

/**
 * Start `python -m memoryd serve --socket <tmp>/d.sock --db <tmp>/d.db --write-policy <policy>`.
 * Ready = accepts a connection on the socket (polled every 10 ms, up to 30 s: a busy 2-core machine starts it slowly).
 * @param {{policy?: 'ask'|'auto'|'off'|null, config?: string, extraArgs?: string[], dir?: string, db?: string}} [opts]
 */
export async function startDaemon({ policy = 'auto', config, extraArgs = [], dir, db } = {}) {
  const ownDir = dir === undefined;
  const tmp = dir ?? shortTempDir();
  const socketPath = path.join(tmp, 'd.sock');
  const dbPath = db ?? path.join(tmp, 'd.db');
  const args = ['-m', 'memoryd', 'serve', '--socket', socketPath, '--db', dbPath];
  if (policy) args.push('--write-policy', policy);
  if (config !== undefined) {
    const cfg = path.join(tmp, 'config.toml');
    writeFileSync(cfg, config);
    args.push('--config', cfg);
  }
  args.push(...extraArgs);
  const proc = spawnChild(pythonCommand(), args, { cwd: tmp, env: daemonEnv(), stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  proc.stderr.setEncoding('utf8');
  proc.stderr.on('data', (c) => {
    stderr += c;
  });
  let exit;
  const exited = new Promise((resolve) => {
    proc.once('exit', (code, signal) => {
      exit = { code, signal };
      resolve(exit);
    });
    proc.once('error', (err) => {
      exit = { code: null, signal: null, error: err };
      resolve(exit);
    });
  });

  const daemon = {
    dir: tmp,
    socketPath,
    dbPath,
    proc,
    args,
    exited,
    stderr: () => stderr,
    get exit() {
      return exit;
    },
    /** SIGTERM (or the given signal), wait for exit (SIGKILL after 5 s), remove the temp dir. */
    async stop(signal = 'SIGTERM') {
      if (!exit) {
        proc.kill(signal);
        const t = setTimeout(() => proc.kill('SIGKILL'), 5000);
        await exited;
        clearTimeout(t);
      }
      if (ownDir) rmSync(tmp, { recursive: true, force: true });
      return exit;
    },
  };

  const deadline = Date.now() + 30_000;
  for (;;) {
    if (exit) {
      if (ownDir) rmSync(tmp, { recursive: true, force: true });
      throw new Error(`memoryd exited early (${JSON.stringify(exit)}): ${pythonCommand()} ${args.join(' ')}\n${stderr}`);
    }
    if (existsSync(socketPath) && (await tryConnect(socketPath))) return daemon;
    if (Date.now() > deadline) {
      await daemon.stop('SIGKILL');
      throw new Error(`memoryd did not accept connections on ${socketPath} within 10 s\n${stderr}`);
    }
    await sleep(10);
  }
}

/**
 * Copies its stdin to a connection to the socket argv[1] and that connection to its stdout,
 * the connection made and held by a grandchild reparented once its parent exited: neither
 * this process's descendant nor its ancestor. The process spawn() sees waits for it.
 */
const DETACHED_PEER = `
import os, select, socket, sys
r, w = os.pipe()
if os.fork() == 0:
    os.close(r)
    middle = os.getpid()
    if os.fork():
        os._exit(0)
    try:
        pidfd = os.pidfd_open(middle)
    except ProcessLookupError:
        pidfd = None
    if pidfd is not None:
        select.select([pidfd], [], [])  # the middle process exited: this one was reparented
        os.close(pidfd)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sys.argv[1])
    reading = [0, s]
    while s in reading:
        for f in select.select(reading, [], [])[0]:
            if f == 0:
                data = os.read(0, 65536)
                if data:
                    s.sendall(data)
                else:
                    reading.remove(0)
                    s.shutdown(socket.SHUT_WR)
            else:
                data = s.recv(65536)
                if not data:
                    reading.remove(s)
                while data:
                    data = data[os.write(1, data):]
    os._exit(0)
os.close(w)
os.read(r, 1)  # EOF: the process that held the connection exited
`;

/**
 * `spawn()` options for a connection that is not this process's nor a relative's: a process
 * of its own (DETACHED_PEER) makes it and copies the bytes, so the daemon sees a pid that
 * is neither this process, its ancestor nor its descendant. A subscribed approver is never
 * asked about a write of its own process or its relatives'; this is how a test puts an
 * approver in another one.
 */
export function foreignRelay(socketPath) {
  return { command: pythonCommand(), args: ['-I', '-S', '-c', DETACHED_PEER, socketPath], env: daemonEnv(), stderr: 'pipe' };
}

/** Config text that admits subscribed approvers without a terminal (the tests have none). */
export const ANY_APPROVERS = 'approvers = "any"\n';

/** Args for `spawn()` over stdio with the test python. */
export function stdioArgs({ db, policy = 'auto', extraArgs = [] } = {}) {
  const args = ['-m', 'memoryd', 'serve', '--stdio', '--standalone', '--db', db];
  if (policy) args.push('--write-policy', policy);
  return [...args, ...extraArgs];
}

/** Poll `fn` until it returns a truthy value (or throw after `timeoutMs`). */
export async function eventually(fn, { timeoutMs = 20_000, intervalMs = 25 } = {}) {
  const deadline = Date.now() + timeoutMs;
  let last;
  for (;;) {
    last = await fn();
    if (last) return last;
    if (Date.now() > deadline) throw new Error(`condition not met within ${timeoutMs} ms (last: ${JSON.stringify(last)})`);
    await sleep(intervalMs);
  }
}

/** Resolve with the next `event` emitted by `emitter` (reject after `timeoutMs`). */
export function nextEvent(emitter, event, timeoutMs = 20_000) {
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => {
      emitter.off(event, on);
      reject(new Error(`no ${event} event within ${timeoutMs} ms`));
    }, timeoutMs);
    const on = (...args) => {
      clearTimeout(t);
      resolve(args.length > 1 ? args : args[0]);
    };
    emitter.once(event, on);
  });
}

export const sleepMs = sleep;

/** A session for the write context. */
export function makeSession(id = 's-1', { cwd = '/tmp/mdjs-proj', agentPreset = 'coder' } = {}) {
  return { id, header: { cwd, agentPreset } };
}
