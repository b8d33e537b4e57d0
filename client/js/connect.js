// Getting an initialized Client: connect() over the daemon's Unix socket (waiting for it, or
// autostarting it) and spawn() of a daemon on stdio.

import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import childProcess from 'node:child_process';
import { fileURLToPath } from 'node:url';

import { MemorydError, clientError, CONNECTION_CLOSED, CONNECTION_FAILED, TIMEOUT } from './errors.js';
import { Client } from './client.js';
import { isTimeout } from './connection.js';
import { DEFAULT_TIMEOUT_MS } from './defaults.js';

/**
 * Default daemon socket: `$MEMORYD_SOCKET` when set, else `$XDG_RUNTIME_DIR/memoryd/memoryd.sock`,
 * else `<os.tmpdir()>/memoryd-<uid>/memoryd.sock` (the daemon's and memoryctl's rule, wire-v1.md §2).
 */
export function defaultSocketPath(env = process.env) {
  if (env.MEMORYD_SOCKET) return env.MEMORYD_SOCKET;
  const xdg = env.XDG_RUNTIME_DIR;
  if (xdg) return path.join(xdg, 'memoryd', 'memoryd.sock');
  const uid = typeof process.getuid === 'function' ? process.getuid() : os.userInfo().uid;
  return path.join(os.tmpdir(), `memoryd-${uid}`, 'memoryd.sock');
}

/** errno codes of a connect that mean "no daemon there (yet)", as opposed to, say, EACCES. */
export const NO_DAEMON_ERRNOS = Object.freeze(['ENOENT', 'ECONNREFUSED']);
/** How long `connect({autostart: true})` waits for the daemon it started, unless `wait` says. */
export const DEFAULT_AUTOSTART_WAIT_MS = 10_000;
/** The daemon's stderr goes here, next to the socket (as memoryctl's autostart does). */
export const AUTOSTART_LOG = 'memoryd.log';
const MAX_TIMER_MS = 2 ** 31 - 1;

/** One connect attempt; rejects with the raw socket error (its `code`, e.g. ENOENT). */
function connectOnce(socketPath, timeoutMs) {
  return new Promise((resolve, reject) => {
    const s = net.createConnection({ path: socketPath });
    let timer;
    const fail = (err) => {
      clearTimeout(timer);
      s.destroy();
      reject(err);
    };
    s.once('error', fail);
    if (isTimeout(timeoutMs)) timer = setTimeout(() => fail(Object.assign(new Error('connect timed out'), { code: 'ETIMEDOUT' })), timeoutMs);
    s.once('connect', () => {
      clearTimeout(timer);
      s.off('error', fail);
      resolve(s);
    });
  });
}

/**
 * A one-shot wake-up for the next change on the way to `socketPath`: an `fs.watch` on the
 * socket's directory, or on its nearest existing ancestor while that directory does not exist
 * yet. The daemon moves its socket into place once it listens, so that directory sees an event
 * exactly when a connection can succeed. Where nothing can be watched, a backoff stands in.
 */
function watchForSocket(socketPath, attempt) {
  let dir = path.dirname(socketPath);
  for (;;) {
    try {
      if (fs.statSync(dir).isDirectory()) break;
    } catch {
      /* missing: look further up */
    }
    const up = path.dirname(dir);
    if (up === dir) break;
    dir = up;
  }
  let wake;
  const changed = new Promise((resolve) => {
    wake = resolve;
  });
  let watcher;
  let timer;
  try {
    watcher = fs.watch(dir, { persistent: false }, () => wake());
    watcher.on('error', () => wake());
  } catch {
    timer = setTimeout(wake, Math.min(10 * 2 ** attempt, 250)); // e.g. inotify limits reached
  }
  return {
    changed,
    close() {
      watcher?.close();
      clearTimeout(timer);
    },
  };
}

/**
 * Connect to `socketPath`, retrying ENOENT/ECONNREFUSED until `deadline` (epoch ms): each
 * retry waits for a change in the socket's directory (or `stop`), never a fixed sleep.
 * Rejects with the last socket error (`err.code`); `timedOut` is set when the deadline passed.
 */
async function connectWaiting(socketPath, { deadline, connectTimeoutMs, stop }) {
  for (let attempt = 0; ; attempt++) {
    const watch = watchForSocket(socketPath, attempt); // armed before the attempt: nothing is missed
    try {
      return await connectOnce(socketPath, connectTimeoutMs);
    } catch (err) {
      if (!NO_DAEMON_ERRNOS.includes(err.code)) throw err;
      const left = deadline - Date.now();
      if (left <= 0) throw Object.assign(err, { timedOut: true });
      let timer;
      const expired = new Promise((resolve) => {
        timer = setTimeout(resolve, Math.min(left, MAX_TIMER_MS)); // a longer wait loops
      });
      const woke = await Promise.race([watch.changed, expired, stop ?? new Promise(() => {})].map((p, i) => p.then(() => i)));
      clearTimeout(timer);
      // `stop`: the daemon we started has exited. One last attempt: another one may have won.
      if (woke === 2) return await connectOnce(socketPath, connectTimeoutMs);
    } finally {
      watch.close();
    }
  }
}

function connectFailed(socketPath, err, extra = {}) {
  const waited = err.timedOut && extra.waitMs > 0 ? ` (waited ${extra.waitMs} ms)` : '';
  return clientError(
    CONNECTION_FAILED,
    `cannot connect to memoryd at ${socketPath}: ${err.message}${waited}`,
    { socketPath, errno: err.code, ...extra },
    err,
  );
}

/** Run `command args` to completion, collecting its output (never rejects). */
function runToExit(command, args, timeoutMs) {
  return new Promise((resolve) => {
    childProcess.execFile(
      command,
      args,
      { cwd: '/', env: { ...process.env, PYTHONUNBUFFERED: '1' }, timeout: timeoutMs, killSignal: 'SIGTERM' },
      (error, stdout, stderr) => resolve({ error, stdout: String(stdout), stderr: String(stderr) }),
    );
  });
}

/** The launcher's last stderr line (the daemon's own reason), as `: <reason>`, or ''. */
function oneLineReason(stderr, log) {
  const last = stderr.split('\n').filter((l) => l.trim()).pop();
  if (!last) return '';
  const reason = last.trim().replace(/^memoryd: /, '').replace(` (log: ${log})`, '');
  return `: ${reason}`;
}

/** This module's directory as stack frames name it (a file: URL), and as a path. */
const OWN_DIR_URL = new URL('.', import.meta.url).href;
const OWN_DIR = fileURLToPath(OWN_DIR_URL);

/**
 * `err` with its stack cut to the caller's frames: the frames of this client and of Node's
 * own modules say nothing to the one who has to act on the message, so a failure raised
 * from here with no caller in its stack shows the message line alone.
 */
function callersStack(err) {
  const frames = String(err.stack).split('\n').filter((line) => /^\s+at /.test(line));
  const theirs = frames.filter((f) => !f.includes(OWN_DIR_URL) && !f.includes(OWN_DIR) && !/[( ]node:/.test(f));
  err.stack = [`${err.name}: ${err.message}`, ...theirs].join('\n');
  return err;
}

/**
 * The autostart command is not there: the one next step is the `memoryd` option (or PATH).
 * No cause: Node's "spawn memoryd ENOENT" says less than the message, and its stack is ours.
 */
function commandNotFound(command, details, option = 'memoryd', call = 'connect') {
  const where = command.includes('/') ? 'does not exist' : 'was not found on PATH';
  return callersStack(clientError(
    CONNECTION_FAILED,
    `cannot start memoryd: the command '${command}' ${where}; install memoryd or pass its path as the ${option} ` +
      `option (${call}({ ${option}: '/path/to/memoryd' }))`,
    { ...details, errno: 'ENOENT' },
  ));
}

/**
 * Start the daemon with its own launcher, `memoryd serve --detach --socket PATH [--db]
 * [--config] [...autostartArgs]`: it starts memoryd in its own session (stderr appended to
 * memoryd.log next to the socket), waits for the daemon's READY=1 and exits, printing the pid.
 * It holds the start lock that memoryctl and `memoryd serve --stdio` take too, so clients of
 * every kind that start at the same moment start one daemon. Resolves `{socket, pid}` (pid
 * undefined when another daemon answered first).
 */
async function autostart(socketPath, options, deadline, connectTimeoutMs) {
  const base = options.memoryd ?? 'memoryd';
  const [command, ...prefix] = Array.isArray(base) ? base : [base];
  const args = [...prefix, 'serve', '--detach', '--socket', socketPath];
  if (options.db !== undefined) args.push('--db', path.resolve(options.db));
  if (options.config !== undefined) args.push('--config', path.resolve(options.config));
  args.push(...(options.autostartArgs ?? []));
  const log = path.join(path.dirname(socketPath), AUTOSTART_LOG);
  const details = { socketPath, log, command: [command, ...args] };
  const { error, stdout, stderr } = await runToExit(command, args, Math.max(1, Math.min(deadline - Date.now(), MAX_TIMER_MS)));
  if (error?.code === 'ENOENT' && error.syscall?.startsWith('spawn')) throw commandNotFound(command, details);
  if (error) {
    const reason = stderr.trim();
    let how;
    if (typeof error.code === 'string') how = `could not be started: ${error.message}`;
    else if (error.killed) how = `did not start on ${socketPath} in time`;
    else how = `exited with ${error.code ?? error.signal} before it was ready${oneLineReason(reason, log)}`;
    throw clientError(CONNECTION_FAILED, `memoryd ${how} (log: ${log})`, { ...details, stderr: reason, exit: { code: error.code, signal: error.signal } }, error);
  }
  const pid = stdout.trim() ? Number.parseInt(stdout, 10) : undefined;
  return { socket: await connectOnce(socketPath, connectTimeoutMs), pid };
}

/**
 * Connect to a daemon over its Unix socket and `initialize`.
 * Options: socketPath, session, write, capabilities ({approvals}), clientInfo ({name, version}),
 * timeoutMs, writeTimeoutMs, connectTimeoutMs, onApproval, onEvent, initialize (extra params);
 * wait (ms: retry while no daemon answers yet, woken by the socket's appearance);
 * autostart (spawn `memoryd serve` when none answers) with memoryd, db, config, autostartArgs.
 */
export async function connect(options = {}) {
  const socketPath = options.socketPath ?? defaultSocketPath();
  const connectTimeoutMs = options.connectTimeoutMs ?? options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  const waitMs = options.wait ?? (options.autostart ? DEFAULT_AUTOSTART_WAIT_MS : 0);
  const deadline = Date.now() + (waitMs > 0 ? waitMs : 0); // Infinity: wait for as long as it takes
  let socket;
  let autostartedPid;
  try {
    socket = await connectWaiting(socketPath, { deadline: options.autostart ? 0 : deadline, connectTimeoutMs });
  } catch (err) {
    if (!options.autostart || !NO_DAEMON_ERRNOS.includes(err.code)) throw connectFailed(socketPath, err, { waitMs });
    try {
      ({ socket, pid: autostartedPid } = await autostart(socketPath, options, deadline, connectTimeoutMs));
    } catch (startErr) {
      if (startErr instanceof MemorydError) throw startErr;
      throw connectFailed(socketPath, startErr, { waitMs });
    }
  }
  const client = new Client({
    ...options,
    readable: socket,
    writable: socket,
    destroyTransport: () => socket.destroy(),
  });
  client.socketPath = socketPath;
  if (autostartedPid !== undefined) client.autostartedPid = autostartedPid;
  try {
    await client.initialize(options.initialize ?? {}, { timeoutMs: connectTimeoutMs });
  } catch (err) {
    client.destroy();
    throw err;
  }
  return client;
}

/**
 * Spawn the daemon as a child (`memoryd serve --stdio` by default) and talk over its
 * stdin/stdout, then `initialize`. Extra options: command, args, env (merged over
 * process.env), cwd, stderr ('inherit' | 'pipe' | 'ignore'; with 'pipe' the text is kept in
 * `client.stderrText` and emitted as `stderr` events), killAfterMs (close(): grace period
 * before SIGTERM, default 5000).
 */
export async function spawn(options = {}) {
  const {
    command = 'memoryd',
    args = ['serve', '--stdio'],
    env,
    cwd,
    stderr = 'inherit',
    killAfterMs = 5000,
  } = options;
  const connectTimeoutMs = options.connectTimeoutMs ?? options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  const child = childProcess.spawn(command, args, {
    cwd,
    env: env ? { ...process.env, ...env } : process.env,
    stdio: ['pipe', 'pipe', stderr],
  });
  let spawnError;
  let exitInfo;
  const exited = new Promise((resolve) => {
    child.once('exit', (code, signal) => {
      exitInfo = { code, signal };
      resolve(exitInfo);
    });
    child.once('error', (err) => {
      spawnError = err;
      if (child.exitCode === null && child.pid === undefined) {
        exitInfo = { code: null, signal: null };
        resolve(exitInfo);
      }
    });
  });

  const shutdown = async () => {
    if (!exitInfo && child.stdin && !child.stdin.destroyed) child.stdin.end();
    const wait = (ms) => Promise.race([exited, new Promise((r) => setTimeout(r, ms).unref())]);
    if (!exitInfo) await wait(killAfterMs);
    if (!exitInfo) {
      child.kill('SIGTERM');
      await wait(2000);
    }
    if (!exitInfo) {
      child.kill('SIGKILL');
      await exited;
    }
    return exitInfo;
  };

  const client = new Client({
    ...options,
    readable: child.stdout,
    writable: child.stdin,
    shutdown,
    destroyTransport: () => {
      child.stdin?.destroy();
      if (!exitInfo) child.kill('SIGTERM');
    },
  });
  client.process = child;
  client.exited = exited;
  client.stderrText = '';
  if (stderr === 'pipe' && child.stderr) {
    child.stderr.setEncoding('utf8');
    child.stderr.on('data', (chunk) => {
      client.stderrText = (client.stderrText + chunk).slice(-1_048_576);
      client._safeEmit('stderr', chunk);
    });
  }
  child.once('error', (err) => {
    client._markClosed(clientError(CONNECTION_CLOSED, `memoryd process error: ${err.message}`, { errno: err.code }, err));
  });

  try {
    await client.initialize(options.initialize ?? {}, { timeoutMs: connectTimeoutMs });
  } catch (err) {
    client.destroy();
    // Node says ENOENT for a missing cwd too: only then is it not the command that is missing.
    if (spawnError?.code === 'ENOENT' && (cwd === undefined || fs.existsSync(cwd))) {
      throw commandNotFound(command, { command, args }, 'command', 'spawn');
    }
    if (spawnError) {
      throw clientError(CONNECTION_FAILED, `cannot spawn ${command}: ${spawnError.message}`, { command, args, errno: spawnError.code }, spawnError);
    }
    if (err.code === CONNECTION_CLOSED || err.code === TIMEOUT) {
      await Promise.race([exited, new Promise((r) => setTimeout(r, 200).unref())]);
      const tail = client.stderrText ? `: ${client.stderrText.trim().split('\n').slice(-5).join('\n')}` : '';
      throw clientError(
        CONNECTION_FAILED,
        `memoryd (${command} ${args.join(' ')}) did not initialize${exitInfo ? ` (exit ${exitInfo.code ?? exitInfo.signal})` : ''}${tail}`,
        { command, args, exit: exitInfo ?? null, stderr: client.stderrText },
        err,
      );
    }
    throw err;
  }
  return client;
}
