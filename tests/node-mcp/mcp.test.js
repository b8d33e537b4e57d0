// memoryd mcp with the official TypeScript MCP client (@modelcontextprotocol/client, v2 of
// the TypeScript SDK), in both eras it speaks: the 2025 `initialize` handshake ("legacy")
// and 2026-07-28 pinned. Run by tests/test_node_mcp.py, which installs this directory's
// package-lock.json with npm ci outside the checkout, starts the daemons and passes them in:
//
//   MEMORYD_MCP_COMMAND   JSON array: the `memoryd` command (`mcp` and its options follow)
//   MEMORYD_MCP_AUTO      JSON {socket, db}: a daemon under write policy auto
//   MEMORYD_MCP_ASK       JSON {socket, db}: a daemon under write policy ask

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { Client } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';

function required(name) {
  const value = process.env[name];
  if (value === undefined) throw new Error(`${name} is not set: run this through tests/test_node_mcp.py`);
  return JSON.parse(value);
}

const COMMAND = required('MEMORYD_MCP_COMMAND');
const AUTO = required('MEMORYD_MCP_AUTO');
const ASK = required('MEMORYD_MCP_ASK');

const PROJ = '/home/u/proj';
const HOST = { name: 'Claude Code', version: '2.1.0' };
const HOST_SOURCE = 'claude-code'; // the source memoryd makes of HOST's name (the layer is the shared one)
const WS = { track: 'user', scope: 'workspace' };
const TOOLS = ['memory_query', 'memory_budgets', 'memory_add', 'memory_replace', 'memory_remove',
  'memory_consolidate', 'memory_propose', 'memory_list'];
const READ_ONLY = ['memory_query', 'memory_budgets', 'memory_list'];
const DESTRUCTIVE = ['memory_remove', 'memory_consolidate'];
const ERAS = { legacy: { mode: 'legacy' }, '2026-07-28': { mode: { pin: '2026-07-28' } } };

/**
 * A connected Client of a `memoryd mcp` child on `daemon`. `answer`: the action the host's
 * user takes on each elicitation (the client then declares elicitation); `asked` collects
 * each elicitation's message.
 */
async function connect(t, daemon, era, { answer, asked = [] } = {}) {
  const [command, ...args] = COMMAND;
  const transport = new StdioClientTransport({
    command,
    args: [...args, 'mcp', '--socket', daemon.socket, '--db', daemon.db, '--cwd', PROJ],
    env: { ...process.env },
    stderr: 'pipe',
  });
  let stderr = '';
  transport.stderr.setEncoding('utf8');
  transport.stderr.on('data', (chunk) => {
    stderr += chunk;
  });
  const capabilities = answer === undefined ? {} : { elicitation: { form: {} } };
  const client = new Client(HOST, { capabilities, versionNegotiation: ERAS[era] });
  if (answer !== undefined) {
    client.setRequestHandler('elicitation/create', async (request) => {
      asked.push(request.params.message);
      return answer === 'accept' ? { action: 'accept', content: {} } : { action: answer };
    });
  }
  t.after(() => client.close());
  try {
    await client.connect(transport);
  } catch (err) {
    err.message += `\n--- memoryd mcp stderr ---\n${stderr}`;
    throw err;
  }
  assert.equal(client.getProtocolEra(), era === 'legacy' ? 'legacy' : 'modern');
  assert.equal(client.getNegotiatedProtocolVersion(), era === 'legacy' ? '2025-11-25' : '2026-07-28');
  return client;
}

// An error result: `CODE: message`, a blank line and {code, message, details} as JSON, with
// no structuredContent for the client to hold to the tool's output schema.
function toolError(r) {
  assert.equal(r.isError, true, JSON.stringify(r));
  assert.equal(r.structuredContent, undefined);
  const [head, blank, ...rest] = r.content[0].text.split('\n');
  const error = JSON.parse(rest.join('\n'));
  assert.deepEqual([head, blank], [`${error.code}: ${error.message}`, '']);
  return error;
}

function texts(entries) {
  return entries.map((e) => e.text);
}

for (const era of Object.keys(ERAS)) {
  describe(`era ${era}`, () => {
    test('lists the 8 tools with their annotations', async (t) => {
      const c = await connect(t, AUTO, era);
      const { tools } = await c.listTools();
      assert.deepEqual(tools.map((tool) => tool.name), TOOLS);
      for (const tool of tools) {
        const a = tool.annotations;
        assert.equal(a.readOnlyHint, READ_ONLY.includes(tool.name), tool.name);
        assert.equal(a.destructiveHint === true, DESTRUCTIVE.includes(tool.name), tool.name);
        assert.equal(a.openWorldHint, false, tool.name);
        assert.equal(tool.inputSchema.type, 'object', tool.name);
        assert.equal(tool.outputSchema.type, 'object', tool.name);
      }
    });

    test('adds, queries, reads memory://entries, gets the prompt, refuses a bad argument', async (t) => {
      const c = await connect(t, AUTO, era);
      const text = `Prefers tabs (${era})`;
      const added = await c.callTool({ name: 'memory_add', arguments: { ...WS, text, tags: ['style'] } });
      assert.equal(added.isError, false);
      const { entry } = added.structuredContent;
      assert.deepEqual([entry.workspaceKey, entry.agentKey, entry.text, entry.tags, entry.source],
        [PROJ, '', text, ['style'], HOST_SOURCE]);

      const q = await c.callTool({ name: 'memory_query', arguments: { text: `TABS (${era.toUpperCase()})` } });
      assert.equal(q.isError, false);
      assert.deepEqual(texts(q.structuredContent.entries), [text]);
      assert.equal(q.structuredContent.entries[0].id, entry.id);
      assert.deepEqual([q.structuredContent.total, q.structuredContent.truncated], [1, false]);

      const read = await c.readResource({ uri: 'memory://entries' });
      assert.equal(read.contents[0].mimeType, 'application/json');
      assert.ok(texts(JSON.parse(read.contents[0].text)).includes(text));

      const { prompts } = await c.listPrompts();
      assert.deepEqual(prompts.map((p) => p.name), ['memory-snapshot']);
      const prompt = await c.getPrompt({ name: 'memory-snapshot' });
      assert.equal(prompt.messages[0].role, 'user');
      assert.equal(prompt.messages[0].content.text, c.getInstructions());

      const bad = await c.callTool({ name: 'memory_add', arguments: { ...WS, text: 5 } });
      assert.equal(toolError(bad).code, 'INVALID_INPUT');
    });

    test('under policy ask, a write the host accepts through elicitation is made', async (t) => {
      const asked = [];
      const c = await connect(t, ASK, era, { answer: 'accept', asked });
      const text = `Accepted write (${era})`;
      const r = await c.callTool({ name: 'memory_add', arguments: { ...WS, text } });
      assert.equal(r.isError, false, JSON.stringify(r));
      assert.equal(r.structuredContent.entry.text, text);
      assert.equal(asked.length, 1);
      assert.deepEqual(asked[0].split('\n').slice(0, 2),
        [`add to user/workspace, shared by every agent, in workspace "${PROJ}":`, `  + ${text}`]);
      for (const shown of [`source:  ${HOST_SOURCE}`, `client:  ${HOST.name} ${HOST.version}`]) {
        assert.ok(asked[0].includes(shown), `${JSON.stringify(shown)} not in ${JSON.stringify(asked[0])}`);
      }
      const q = await c.callTool({ name: 'memory_query', arguments: { text } });
      assert.deepEqual(texts(q.structuredContent.entries), [text]);
    });

    test('under policy ask, a write the host declines is denied and not made', async (t) => {
      const asked = [];
      const c = await connect(t, ASK, era, { answer: 'decline', asked });
      const text = `Declined write (${era})`;
      const r = await c.callTool({ name: 'memory_add', arguments: { ...WS, text } });
      assert.deepEqual(toolError(r), {
        code: 'WRITE_DENIED', message: 'write denied: rejected', details: { outcome: 'rejected' } });
      assert.equal(asked.length, 1);
      const q = await c.callTool({ name: 'memory_query', arguments: { text } });
      assert.deepEqual(q.structuredContent.entries, []);
    });
  });
}
