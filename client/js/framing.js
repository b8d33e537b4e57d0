// Newline-delimited JSON framing (wire-v1.md §1): UTF-8, one JSON message per line.

import { StringDecoder } from 'node:string_decoder';

/**
 * Incremental line splitter. Feed it raw chunks (Buffer/Uint8Array/string) as they arrive;
 * it returns the complete lines seen so far. Partial lines are kept until their `\n`
 * arrives, and a multi-byte UTF-8 character split across chunks is decoded correctly.
 */
export class LineDecoder {
  /** @param {{maxLineBytes?: number}} [opts] lines longer than this are dropped (reported via `onOverflow`). */
  constructor({ maxLineBytes = Infinity, onOverflow } = {}) {
    this._decoder = new StringDecoder('utf8');
    this._buf = '';
    this._maxLineBytes = maxLineBytes;
    this._onOverflow = onOverflow;
    this._discarding = false;
  }

  /** @returns {string[]} complete lines (without the trailing `\n` / `\r\n`), blank lines skipped. */
  push(chunk) {
    const text = typeof chunk === 'string' ? chunk : this._decoder.write(chunk);
    return this._take(text);
  }

  /** Flush at end of stream: returns a final unterminated line if there is one. */
  end() {
    const rest = this._decoder.end();
    const lines = this._take(rest);
    const tail = this._buf;
    this._buf = '';
    if (!this._discarding && tail.trim() !== '') lines.push(stripCR(tail));
    this._discarding = false;
    return lines;
  }

  _tooLong(s) {
    return s.length * 3 > this._maxLineBytes && Buffer.byteLength(s, 'utf8') > this._maxLineBytes;
  }

  _take(text) {
    const lines = [];
    if (!text) return lines;
    let start = 0;
    let nl;
    while ((nl = text.indexOf('\n', start)) !== -1) {
      const piece = text.slice(start, nl);
      start = nl + 1;
      if (this._discarding) {
        this._discarding = false;
        this._buf = '';
        continue;
      }
      const line = stripCR(this._buf + piece);
      this._buf = '';
      if (this._tooLong(line)) this._onOverflow?.();
      else if (line.trim() !== '') lines.push(line);
    }
    if (!this._discarding) {
      this._buf += text.slice(start);
      if (this._tooLong(this._buf)) {
        this._buf = '';
        this._discarding = true;
        this._onOverflow?.();
      }
    }
    return lines;
  }
}

function stripCR(line) {
  return line.endsWith('\r') ? line.slice(0, -1) : line;
}

/** Serialize one message as an NDJSON line (JSON.stringify never emits a raw newline). */
export function encodeMessage(message) {
  return JSON.stringify(message) + '\n';
}
