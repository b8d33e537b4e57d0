"""``memoryd mcp`` through the MCP clients of real agent hosts: Claude Code, Gemini CLI and
Codex, from npm at the versions tests/hosts/package-lock.json pins, plus the MCP Inspector's
CLI (tests/node-mcp).

Each host runs for real, in a fresh HOME of the test's, configured as a user would
configure it, with its model replaced by tests/hosts/model_standin.py on 127.0.0.1: the
prompt scripts the tool calls (``CALL memory_add {...}``), the stand-in makes them under
the name the host lists the tool by and records what the host sends it: the tool list
(names and input schemas), the system text, and every tool result as the model reads it.
tests/hosts/mcp_tap.py sits between the host and ``memoryd mcp`` and reports each JSON-RPC
line, so the test also sees what the host declares (its capabilities) and when the server
asks it something (an elicitation). tests/hosts/FINDINGS.md is what these tests established about each host.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from hosts.harness import HOSTS, HostRun, Tap, memoryd_command, server_command
from hosts.model_standin import StandIn, ToolResult
from hosts.screen import Screen
from memoryd_protocol import mcp_tools
from npm_cache import npm_install

HOSTS_DIR = Path(__file__).resolve().parent / "hosts"
NODE_MCP = Path(__file__).resolve().parent / "node-mcp"
TOOLS = [t.name for t in mcp_tools.TOOLS]
VERSIONS = {"claude-code": "2.1.332", "gemini-cli": "0.61.0", "codex": "0.171.0"}
#: the agent layer name each host's writes carry as their source (its clientInfo, normalized)
SOURCES = {"claude-code": "claude-code", "gemini-cli": "gemini-cli", "codex": "codex"}

#: What each host declares and does, as these tests found it (tests/hosts/FINDINGS.md).
#: era: the MCP handshake it speaks; elicitation: the modes it declares; instructions:
#: whether the server's instructions reach the model's request.
CAPABILITIES = {
    "claude-code": {"era": "2026-07-28", "client": "claude-code", "elicitation": {"form": {}, "url": {}},
                    "instructions": True},
    "gemini-cli": {"era": "2025-06-18", "client": "gemini-cli-mcp-client", "elicitation": None,
                   "instructions": True},
    # Codex: as the description of the tool namespace ``mcp__memoryd`` it sends the model
    "codex": {"era": "2025-06-18", "client": "codex-mcp-client", "elicitation": {"form": {}, "url": {}},
              "instructions": True},
}


@pytest.fixture(scope="session")
def hosts_install() -> Path:
    return npm_install(HOSTS_DIR)


@pytest.fixture(scope="session")
def node_mcp_install() -> Path:
    return npm_install(NODE_MCP)


@pytest.fixture
def standin() -> Iterator[StandIn]:
    with StandIn() as s:
        yield s


@pytest.fixture
def tap() -> Iterator[Tap]:
    with Tap.open() as t:
        yield t


def _host(name: str, install: Path, tmp: Path, daemon: Any, tap: Tap, standin: StandIn,
          workspace: Path | None = None) -> HostRun:
    return HostRun(name, install, tmp / f"home-{name}", workspace or tmp / "proj", server_command(daemon, tap),
                   standin.url)


def _script(*calls: tuple[str, dict[str, Any]]) -> str:
    lines = [f"CALL {name} {json.dumps(args)}" for name, args in calls]
    return "Run these memory tool calls in order, then say DONE.\n" + "\n".join(lines)


def _strings(value: Any, depth: int = 0) -> Iterator[str]:
    """Every string in ``value``, and in every JSON document embedded in one (hosts wrap a
    tool result in their own JSON text)."""
    if isinstance(value, dict):
        for v in value.values():
            yield from _strings(v, depth)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v, depth)
    elif isinstance(value, str):
        yield value
        if depth < 4:
            decoder = json.JSONDecoder()
            i = 0
            while (i := min((j for j in (value.find("{", i), value.find("[", i)) if j >= 0), default=-1)) >= 0:
                try:
                    inner, end = decoder.raw_decode(value, i)
                except ValueError:
                    i += 1
                    continue
                yield from _strings(inner, depth + 1)
                i = end


def tool_error(result: ToolResult, code: str) -> dict[str, Any]:
    """The error ``code`` as the model read it: a text whose first line is ``CODE:
    message``, then a blank line, then ``{"code", "message", "details"}``."""
    for s in _strings([result.text, result.raw]):
        head, sep, rest = s.partition("\n\n")
        if sep and head.startswith(f"{code}: "):
            try:
                body = json.loads(rest)
            except ValueError:
                continue
            assert body["code"] == code and head == f"{code}: {body['message']}", s
            assert isinstance(body["details"], dict), s
            return dict(body)
    raise AssertionError(f"the model did not read a {code} error as 'CODE: message', a blank line and "
                         f"{{code, message, details}}; it read: {result.text[:1500]!r}")


#: Gemini CLI adds this parameter to every tool (it lets the model order parallel calls)
GEMINI_WAIT = {"type": "boolean", "description": (
    "Set to true to wait for all previously requested tools in this turn to complete before starting. Set to "
    "false (or omit) to run in parallel. Use true when this tool depends on the output of previous tools.")}
#: the JSON Schema keywords Codex passes to the model; it drops every other (the limits:
#: minLength, maxLength, maxItems, minimum, pattern, uniqueItems, but not minItems; and default, $comment)
CODEX_KEYWORDS = frozenset({"type", "description", "enum", "properties", "required", "additionalProperties", "minItems",
                            "items", "anyOf"})


def _codex_subset(node: Any) -> Any:
    if isinstance(node, list):
        return [_codex_subset(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: (dict((name, _codex_subset(v)) for name, v in node[k].items()) if k == "properties"
               else _codex_subset(node[k])) for k in node if k in CODEX_KEYWORDS}
    if "enum" in out and "type" not in out and all(isinstance(v, str) for v in out["enum"]):
        out["type"] = "string"  # an enum of strings gets its type spelled out
    return out


def expected_schemas(host: str) -> dict[str, dict[str, Any]]:
    """Each tool's input schema as the host hands it to the model: the server's, exactly,
    but for the host's own documented normalisation (tests/hosts/FINDINGS.md)."""
    schemas = {t.name: mcp_tools.input_schema(t) for t in mcp_tools.TOOLS}
    if host == "gemini-cli":
        return {name: {**s, "properties": {**s["properties"], "wait_for_previous": GEMINI_WAIT}}
                for name, s in schemas.items()}
    if host == "codex":
        return {name: _codex_subset(s) for name, s in schemas.items()}
    return schemas


def host_tools(host: str, standin: StandIn) -> dict[str, dict[str, Any]]:
    """The memoryd tools of the host's tool list, by their MCP name."""
    prefix = {"claude-code": "mcp__memoryd__", "gemini-cli": "mcp_memoryd_", "codex": "mcp__memoryd/"}[host]
    return {name.removeprefix(prefix): schema for name, schema in standin.tools.items() if name.startswith(prefix)}


# --- a, b: the tools listed, a query answered -------------------------------------------

@pytest.mark.parametrize("host", HOSTS)
def test_the_host_lists_every_tool_unchanged_and_reads_a_query(host: str, daemon_factory: Any, hosts_install: Path,
                                                               tmp_path: Path, standin: StandIn, tap: Tap) -> None:
    d = daemon_factory()
    h = _host(host, hosts_install, tmp_path, d, tap, standin)
    h.prompt(_script(("memory_add", {"track": "user", "scope": "workspace", "text": "Prefers tabs"}),
                     ("memory_query", {"text": "tabs"})))
    tools = host_tools(host, standin)
    assert sorted(tools) == sorted(TOOLS), f"{host} lists {sorted(standin.tools)}"
    want = expected_schemas(host)
    differ = {name: tools[name] for name in TOOLS if tools[name] != want[name]}
    assert not differ, f"{host} changed the input schemas of {sorted(differ)}: {json.dumps(differ)[:3000]}"
    # the query's result reached the model
    query = standin.result("memory_query")
    assert "Prefers tabs" in query.text and query.is_error in (False, None), query
    added = standin.result("memory_add")
    assert added.is_error in (False, None), added


# --- what each host declares, and whether the instructions reach the model ---------------

@pytest.mark.parametrize("host", HOSTS)
def test_what_the_host_declares_and_passes_on(host: str, daemon_factory: Any, hosts_install: Path, tmp_path: Path,
                                              standin: StandIn, tap: Tap) -> None:
    d = daemon_factory()
    seed = _host(host, hosts_install, tmp_path / "seed", d, tap, standin, workspace=tmp_path / "proj")
    seed.prompt(_script(("memory_add", {"track": "user", "scope": "workspace", "text": "Prefers tabs"})))
    seeded = standin.result("memory_add")
    # (Gemini CLI hands the model the short text, "added <id> in user/workspace ...")
    assert seeded.is_error in (False, None) and ("Prefers tabs" in seeded.text or "added " in seeded.text), seeded
    with StandIn() as second, Tap.open() as tap2:
        h = _host(host, hosts_install, tmp_path, d, tap2, second)
        h.prompt(_script(("memory_budgets", {})))
        want = CAPABILITIES[host]
        era, client, caps = _declared(tap2)
        assert (era, client["name"], client.get("version")) == (want["era"], want["client"], VERSIONS[host])
        assert caps.get("elicitation") == want["elicitation"], caps
        served = [m["msg"]["result"]["instructions"] for m in tap2.messages if m["dir"] == "server"
                  and isinstance(m["msg"], dict) and "instructions" in m["msg"].get("result", {})]
        assert served and "Prefers tabs" in served[0], f"the server's instructions lack the fact: {served}"
        request = json.dumps(second.turns[0].body)
        assert ("Prefers tabs" in request) is want["instructions"], second.turns[0].system[-3000:]
        if host == "codex":
            [namespace] = [t for t in second.turns[0].body["tools"] if t.get("name") == "mcp__memoryd"]
            assert namespace["description"] == served[0], namespace


def _declared(tap: Tap) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(protocol version, clientInfo, capabilities) of the host's first handshake request."""
    first = tap.wait_for(lambda m: m["dir"] == "host" and isinstance(m["msg"], dict) and "method" in m["msg"])["msg"]
    params = first.get("params", {})
    if first["method"] == "initialize":
        return params["protocolVersion"], params["clientInfo"], params.get("capabilities", {})
    meta = params.get("_meta", {})
    return (meta["io.modelcontextprotocol/protocolVersion"], meta["io.modelcontextprotocol/clientInfo"],
            meta.get("io.modelcontextprotocol/clientCapabilities", {}))


# --- d: errors the model reads: budget, ambiguity, a denied write ------------------------

ERRORS_CONFIG = """\
[budgets.user]
workspace = 40
[write_policies]
"agent/workspace" = "ask"
"""
#: the text of the write each host is asked to approve: many lines, each longer than a
#: dialog's width, so the approval's message must carry every line whole below the headline
LONG_TEXT = "Ran the tests before the release:\n" + "\n".join(
    f"suite {n}: every case passed on the first try, with no retries, no skips and no reruns, on the "
    f"machine's Python and on the oldest one supported, in {n * 7} seconds" for n in range(1, 7))
#: how each host answers, under ``-p``, a write in an ``ask`` layer when no approver is subscribed
DENIED_OUTCOME = {
    # print mode has nobody to show the dialog to, so it retries the call with the answer
    # ``cancel`` itself, which the daemon records as cancelled
    "claude-code": "cancelled",
    # it declares no elicitation, so the write is asked of subscribed approvers, and with
    # none subscribed the daemon denies it at once
    "gemini-cli": "unavailable",
}


def approval_message(message: str, host: str, workspace: Path, text: str, pid: int) -> list[str]:
    """The lines ``message`` must be, whole: the headline, every line of ``text`` marked
    added, then who asks (the session and approval ids, random, are read off ``message``)."""
    ids = re.findall(r"^  (?:session|id): +([0-9a-f-]{36})$", message, re.MULTILINE)
    assert len(ids) == 2, message
    client = CAPABILITIES[host]["client"]
    return [f'add to agent/workspace, shared by every agent, in workspace "{workspace}":',
            *(f"  + {line}" for line in text.split("\n")),
            "  tags:    -",
            f"  source:  {SOURCES[host]}",
            f"  session: {ids[0]}",
            f"  client:  {client} {VERSIONS[host]} (an MCP host, through memoryd mcp)",
            f"  process: pid {pid} ({os.path.realpath(sys.executable)})",
            f"  id:      {ids[1]}"]


@pytest.mark.parametrize("host", HOSTS)
def test_errors_reach_the_model_with_code_and_details(host: str, daemon_factory: Any, hosts_install: Path,
                                                      tmp_path: Path, standin: StandIn, tap: Tap) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(ERRORS_CONFIG)
    d = daemon_factory("--config", str(cfg), policy="auto")
    h = _host(host, hosts_install, tmp_path, d, tap, standin)
    h.prompt(_script(
        ("memory_add", {"track": "user", "scope": "workspace", "text": "Prefers tabs"}),
        ("memory_add", {"track": "user", "scope": "workspace", "text": "Wraps lines at one hundred and twenty"}),
        ("memory_add", {"track": "agent", "scope": "user-global", "text": "Build with make"}),
        ("memory_add", {"track": "agent", "scope": "user-global", "text": "Build the docs with make"}),
        ("memory_remove", {"track": "agent", "scope": "user-global", "match": "make"}),
        ("memory_add", {"track": "agent", "scope": "workspace", "text": LONG_TEXT}),
    ))
    assert standin.result("memory_add", 0).is_error in (False, None)
    results = {"BUDGET_EXCEEDED": standin.result("memory_add", 1), "AMBIGUOUS_MATCH": standin.result("memory_remove")}
    if host == "codex":
        # `codex exec --dangerously-bypass-approvals-and-sandbox` answers the server's
        # elicitation itself, with accept (and no content): nobody is asked, the write is made
        [(asked, server)] = [(m["msg"], m["pid"]) for m in tap.messages if m["dir"] == "server"
                             and isinstance(m["msg"], dict) and m["msg"].get("method") == "elicitation/create"]
        message = asked["params"]["message"]
        assert message.split("\n") == approval_message(message, host, h.workspace, LONG_TEXT, server), message
        [answer] = [m["msg"] for m in tap.messages if m["dir"] == "host" and isinstance(m["msg"], dict)
                    and m["msg"].get("id") == asked["id"] and "result" in m["msg"]]
        assert answer["result"]["action"] == "accept", answer
        ran = standin.result("memory_add", 4)
        assert "Ran the tests before the release" in ran.text and "WRITE_DENIED" not in ran.text, ran
    else:
        results["WRITE_DENIED"] = standin.result("memory_add", 4)
    if host == "claude-code":
        # the approval goes back as an input-required result, its message complete (the
        # dialog shows its first lines; under -p nobody sees it), and the call is retried
        # with the answer cancel
        [(form, server)] = [(m["msg"]["result"]["inputRequests"]["approval"], m["pid"]) for m in tap.messages
                            if m["dir"] == "server" and isinstance(m["msg"], dict)
                            and m["msg"].get("result", {}).get("resultType") == "input_required"]
        message = form["params"]["message"]
        assert message.split("\n") == approval_message(message, host, h.workspace, LONG_TEXT, server), message
        retried = [m["params"]["inputResponses"] for m in tap.requests("tools/call") if "inputResponses" in m["params"]]
        assert retried == [{"approval": {"action": "cancel"}}], retried
    flagged = {code: r.is_error for code, r in results.items()}
    # Claude Code and Gemini CLI tell the model a result is an error; Codex's function
    # output has no such flag (the model reads the text)
    assert flagged == dict.fromkeys(results, None if host == "codex" else True)
    budget = tool_error(results["BUDGET_EXCEEDED"], "BUDGET_EXCEEDED")
    assert (budget["details"]["track"], budget["details"]["scope"], budget["details"]["limit"]) == (
        "user", "workspace", 40), budget
    ambiguous = tool_error(results["AMBIGUOUS_MATCH"], "AMBIGUOUS_MATCH")
    assert (ambiguous["details"]["candidates"], len(ambiguous["details"]["ids"])) == (2, 2), ambiguous
    if host != "codex":
        denied = tool_error(results["WRITE_DENIED"], "WRITE_DENIED")
        assert denied["details"] == {"outcome": DENIED_OUTCOME[host]}, denied
        with contextlib.closing(sqlite3.connect(d.db_path)) as db:
            layer = db.execute("SELECT text FROM entries WHERE track = 'agent' AND scope = 'workspace'").fetchall()
        assert layer == [], layer


APPROVERS_CONFIG = """\
mcp_approvals = "approvers"
[write_policies]
"agent/workspace" = "ask"
"""


def test_codex_cannot_answer_a_write_that_only_an_approver_may_approve(
        daemon_factory: Any, hosts_install: Path, tmp_path: Path, standin: StandIn, tap: Tap) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(APPROVERS_CONFIG)
    d = daemon_factory("--config", str(cfg), policy="auto")
    h = _host("codex", hosts_install, tmp_path, d, tap, standin)
    h.prompt(_script(("memory_add", {"track": "agent", "scope": "workspace", "text": "Ran the tests"}),
                     ("memory_add", {"track": "user", "scope": "workspace", "text": "Prefers tabs"})))
    # mcp_approvals = "approvers": the write is never put to Codex, so the bypass flag that
    # accepts every elicitation has nothing to accept; no approver is subscribed
    assert tap.requests("elicitation/create") == [], tap.requests("elicitation/create")
    denied = standin.result("memory_add", 0)
    assert denied.is_error is None, denied
    assert tool_error(denied, "WRITE_DENIED")["details"] == {"outcome": "unavailable"}, denied
    added = standin.result("memory_add", 1)
    assert "Prefers tabs" in added.text and "WRITE_DENIED" not in added.text, added
    # the denied write left the store as it was: only the other layer's add is there
    with contextlib.closing(sqlite3.connect(d.db_path)) as db:
        entries = db.execute("SELECT track, scope, text FROM entries").fetchall()
    assert entries == [("user", "workspace", "Prefers tabs")], entries


# --- e: the hosts' own listing ------------------------------------------------------------

@pytest.mark.parametrize("host", HOSTS)
def test_the_hosts_mcp_list(host: str, daemon_factory: Any, hosts_install: Path, tmp_path: Path,
                            standin: StandIn, tap: Tap) -> None:
    d = daemon_factory()
    h = _host(host, hosts_install, tmp_path, d, tap, standin)
    # run twice: the second health check finds the memory as the first left it
    runs = [h.mcp_list(), h.mcp_list()]
    for r in runs:
        assert r.returncode == 0, r.stdout + r.stderr
    out = runs[0].stdout + runs[0].stderr
    assert runs[1].stdout + runs[1].stderr == out
    [line] = [x for x in out.splitlines() if "memoryd" in x]
    if host == "claude-code":
        assert line.startswith("memoryd: ") and line.endswith("✔ Connected"), out
    elif host == "gemini-cli":
        assert line.startswith("✓ memoryd: ") and line.endswith("(stdio) - Connected"), out
        # its health check connects and pings: a connection, no tool listing
        assert [m["msg"].get("method") for m in tap.messages if m["dir"] == "host"][:3] == [
            "initialize", "notifications/initialized", "ping"]
    if host != "codex":
        # each check is a session with its frozen snapshot; the unchanged text is kept once
        with contextlib.closing(sqlite3.connect(d.db_path)) as db:
            sessions = db.execute("SELECT digest FROM memoryd_snapshots").fetchall()
            texts = db.execute("SELECT digest FROM memoryd_snapshot_texts").fetchall()
        assert len(sessions) == 2 and texts == sessions[:1], (sessions, texts)
    else:
        # `codex mcp list` shows the configuration, it connects to nothing; the tools Codex
        # lists are those it sent the model (the other tests)
        assert line.split()[:2] == ["memoryd", h.server[0]] and "enabled" in line.split(), out
        assert tap.messages == []


# --- f: one memory across hosts -----------------------------------------------------------

def test_a_fact_added_through_claude_code_reaches_gemini_cli_and_codex(daemon_factory: Any, hosts_install: Path,
                                                                        tmp_path: Path) -> None:
    d = daemon_factory()
    workspace = tmp_path / "proj"
    seen: dict[str, ToolResult] = {}
    entries: list[dict[str, Any]] = []
    for host in HOSTS:
        with StandIn() as s, Tap.open() as tap:
            h = _host(host, hosts_install, tmp_path, d, tap, s, workspace=workspace)
            if host == "claude-code":
                h.prompt(_script(("memory_add", {"track": "user", "scope": "workspace", "text": "Prefers tabs"}),
                                 ("memory_list", {})))
                entries = [e for r in _json_docs(s.result("memory_list").text) for e in r.get("entries", [])]
            else:
                h.prompt(_script(("memory_query", {"text": "tabs"})))
                seen[host] = s.result("memory_query")
    [entry] = [e for e in entries if e.get("text") == "Prefers tabs"]
    # the shared agent layer by default, the host named as the source, the workspace
    # the host started the server in
    assert (entry["agentKey"], entry["source"], entry["workspaceKey"]) == ("", "claude-code", str(workspace)), entry
    for host, r in seen.items():
        assert "Prefers tabs" in r.text, f"{host} does not see Claude Code's fact: {r.text[:1000]}"


def _json_docs(text: str) -> list[dict[str, Any]]:
    return [json.loads(s) for s in _strings(text) if s.startswith("{")] or [
        doc for s in _strings(text) if isinstance(doc := _try_json(s), dict)]


def _try_json(s: str) -> Any:
    try:
        return json.loads(s)
    except ValueError:
        return None


# --- c: approvals: an approver for Gemini CLI ----------------------------------------------

@pytest.mark.anyio
async def test_gemini_cli_declares_no_elicitation_so_an_approver_approves_its_add(
        daemon_factory: Any, hosts_install: Path, tmp_path: Path, standin: StandIn, tap: Tap) -> None:
    from rawclient import socket_client

    cfg = tmp_path / "config.toml"
    cfg.write_text('approvers = "any"\n')
    d = daemon_factory("--config", str(cfg), policy="ask")
    h = _host("gemini-cli", hosts_install, tmp_path, d, tap, standin)
    asked: list[dict[str, Any]] = []

    async def approve(params: dict[str, Any]) -> str:
        asked.append(params)
        return "allowed-once"

    async with socket_client(d.socket_path, foreign=True) as approver:
        approver.on_approval = approve
        await approver.ok("approval/subscribe", {})
        await anyio.to_thread.run_sync(h.prompt, _script(
            ("memory_add", {"track": "user", "scope": "workspace", "text": "Prefers tabs"})))
    [params] = asked
    assert params["origin"]["frontEnd"] == "mcp" and params["origin"]["name"] == "gemini-cli-mcp-client", params
    assert "Prefers tabs" in json.dumps(params), params
    # Gemini CLI hands the model the result's text (not structuredContent), fenced
    added = standin.result("memory_add")
    assert added.is_error is False and added.text.startswith("<untrusted_context>\nadded "), added
    assert "in user/workspace" in added.text, added


# --- the MCP Inspector's CLI: list, call, error -----------------------------------------------

def _inspector(install: Path, home: Path, daemon: Any, *args: str, status: int = 0,
               tap: Tap | None = None) -> dict[str, Any]:
    """The Inspector CLI's JSON answer; ``status``: its exit status (5: a tool result with
    isError, which it prints all the same); with ``tap``, the server behind it."""
    home.mkdir(exist_ok=True)
    server = (server_command(daemon, tap, "--cwd", "/home/u/proj") if tap is not None else
              [*memoryd_command(), "mcp", "--socket", str(daemon.socket_path), "--db", str(daemon.db_path),
               "--cwd", "/home/u/proj"])
    argv = [str(install / "node_modules" / ".bin" / "mcp-inspector"), "--cli", "--format", "json", *args,
            "--", *server]
    r = subprocess.run(argv, env=dict(os.environ, HOME=str(home)), capture_output=True, text=True, timeout=120)
    assert r.returncode == status, r.stdout[-3000:] + r.stderr[-3000:]
    return dict(json.loads(r.stdout))


def _inspector_error(install: Path, home: Path, daemon: Any, code: str, tool: str, tap: Tap | None = None,
                     **args: str) -> dict[str, Any]:
    """The error ``code`` the Inspector CLI prints for a call of ``tool``: a result with
    isError and the error as its one text."""
    argv = [f"--tool-arg={k}={v}" for k, v in args.items()]
    result = _inspector(install, home, daemon, "--method", "tools/call", "--tool-name", tool, *argv,
                        status=5, tap=tap)["result"]
    assert result["isError"] is True and "structuredContent" not in result, result
    [content] = result["content"]
    return tool_error(ToolResult(tool, content["text"], True, content), code)


def test_the_inspector_lists_calls_and_reads_the_errors(daemon_factory: Any, node_mcp_install: Path,
                                                       tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(ERRORS_CONFIG)
    d = daemon_factory("--config", str(cfg), policy="auto")
    home = tmp_path / "home"
    listed = _inspector(node_mcp_install, home, d, "--method", "tools/list")["result"]["tools"]
    assert {t["name"]: t["inputSchema"] for t in listed} == expected_schemas("inspector")
    for t in listed:
        assert t["inputSchema"]["type"] == "object" and not {"oneOf", "anyOf", "allOf", "not"} & set(t["inputSchema"])
    for text in ("Build with make", "Build the docs with make"):
        _inspector(node_mcp_install, home, d, "--method", "tools/call", "--tool-name", "memory_add",
                   "--tool-arg", "track=agent", "--tool-arg", "scope=user-global", "--tool-arg", f"text={text}")
    got = _inspector(node_mcp_install, home, d, "--method", "tools/call", "--tool-name", "memory_query",
                     "--tool-arg", "text=make")["result"]
    assert got["structuredContent"]["total"] == 2 and not got.get("isError"), got
    body = _inspector_error(node_mcp_install, home, d, "AMBIGUOUS_MATCH", "memory_remove", track="agent",
                            scope="user-global", match="make")
    assert (body["details"]["candidates"], len(body["details"]["ids"])) == (2, 2), body
    _inspector(node_mcp_install, home, d, "--method", "tools/call", "--tool-name", "memory_add",
               "--tool-arg", "track=user", "--tool-arg", "scope=workspace", "--tool-arg", "text=Prefers tabs")
    budget = _inspector_error(node_mcp_install, home, d, "BUDGET_EXCEEDED", "memory_add", track="user",
                              scope="workspace", text="Wraps lines at one hundred and twenty")
    assert (budget["details"]["track"], budget["details"]["scope"], budget["details"]["limit"]) == (
        "user", "workspace", 40), budget
    # the Inspector's CLI declares no elicitation and no approver is subscribed: nobody can
    # be asked, so the daemon denies the write at once
    with Tap.open() as tap:
        denied = _inspector_error(node_mcp_install, home, d, "WRITE_DENIED", "memory_add", tap, track="agent",
                                  scope="workspace", text="Ran the tests")
        _era, client, caps = _declared(tap)
        assert (client["name"], "elicitation" in caps, tap.requests("elicitation/create")) == (
            "inspector-cli", False, []), (client, caps)
    assert denied["details"] == {"outcome": "unavailable"}, denied
    # neither error wrote: the store holds the three adds that were allowed
    with contextlib.closing(sqlite3.connect(d.db_path)) as db:
        entries = sorted(db.execute("SELECT track, scope, text FROM entries").fetchall())
    assert entries == [("agent", "user-global", "Build the docs with make"), ("agent", "user-global", "Build with make"),
                       ("user", "workspace", "Prefers tabs")], entries



# --- interactive: the hosts' own terminal UIs (tmux) ---------------------------------------

def _listed(m: dict[str, Any]) -> bool:
    return m["dir"] == "server" and isinstance(m["msg"], dict) and "tools" in m["msg"].get("result", {})


def _call(retry: bool) -> Callable[[dict[str, Any]], bool]:
    """A tools/call from the host: the first call, or its retry carrying the answers."""
    return lambda m: (m["dir"] == "host" and isinstance(m["msg"], dict) and m["msg"].get("method") == "tools/call"
                      and ("inputResponses" in m["msg"].get("params", {})) is retry)


def _readme_dialog(workspace: Path) -> list[str]:
    """The lines of the README's block that shows Claude Code's approval dialog, for
    ``workspace``."""
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    block = readme.split("What Claude Code's dialog shows of an approval", 1)[1].split("```text\n", 1)[1]
    lines = block.split("\n```", 1)[0].replace("/home/u/proj", str(workspace)).splitlines()
    return [line.strip() for line in lines]


def _shows(screen: Screen, text: str, timeout: float) -> bool:
    """Whether the screen shows ``text`` within ``timeout`` seconds."""
    try:
        screen.wait_for(lambda t: text in t, timeout=timeout)
    except AssertionError:
        return False
    return True


def _squeezed(text: str) -> str:
    """``text`` without its whitespace: a line the terminal wrapped compares equal."""
    return "".join(text.split())


def test_claude_codes_approval_dialog_accepts_a_write_in_a_real_terminal(
        daemon_factory: Any, hosts_install: Path, tmp_path: Path, standin: StandIn, tap: Tap) -> None:
    from rawclient import socket_client

    d = daemon_factory(policy="ask")
    h = _host("claude-code", hosts_install, tmp_path, d, tap, standin)
    argv = [*h.argv(), "--allowedTools", "mcp__memoryd", "--debug-file", str(h.home / "claude-debug.txt")]
    with Screen(argv, cwd=h.workspace, env=h.env()) as screen:
        # interactive Claude Code does not wait for its MCP servers, and the tap seeing the
        # tool list go by is not the host holding it: type once its own /mcp panel counts them
        tools = len(tap.wait_for(_listed)["msg"]["result"]["tools"])
        screen.wait_for(lambda t: "❯" in t, what="the prompt")
        screen.type("/mcp")
        screen.wait_for(lambda t: "/mcp" in t, what="the typed /mcp")
        screen.press_until("Enter", lambda t: _shows(screen, "MCP servers", t), what="the MCP panel")
        screen.wait_for(lambda t: re.search(rf"✔ memoryd +{tools} tools", t) is not None,
                        what=f"memoryd connected with {tools} tools")
        screen.send("Escape")
        screen.wait_for(lambda t: "MCP servers" not in t, what="the MCP panel closed")
        screen.type('CALL memory_add {"track":"user","scope":"workspace","text":"Prefers tabs"}')
        screen.wait_for(lambda t: "Prefers tabs" in t, what="the typed prompt")
        screen.press_until("Enter", lambda t: tap.arrived(_call(retry=False), t), what="a tools/call",
                            wait=5)
        asked = tap.wait_for(lambda m: m["dir"] == "server" and isinstance(m["msg"], dict)
                             and m["msg"].get("result", {}).get("resultType") == "input_required")["msg"]["result"]
        form = asked["inputRequests"]["approval"]
        assert form["method"] == "elicitation/create" and form["params"]["requestedSchema"] == {
            "type": "object", "properties": {}}, form
        headline = form["params"]["message"].split("\n")[0]
        shown = screen.wait_for(lambda t: "requests your input" in t and "Decline" in t, what="the approval dialog")
        assert _squeezed(headline) in _squeezed(shown), f"{headline!r} is not on the screen:\n{shown}"
        # the README's picture of this dialog is what is on the screen, line by line
        on_screen = [line.strip() for line in shown.splitlines()]
        for line in _readme_dialog(h.workspace):
            assert line in on_screen or _squeezed(line) in _squeezed(shown), f"{line!r} is not on the screen:\n{shown}"
        # Enter on Accept. The dialog refuses an Enter in its first 150 ms on screen, and
        # each refused one starts the 150 ms again (FINDINGS.md): pressed again only if no
        # retry reached the server within a second
        presses = screen.press_until("Enter", lambda t: tap.arrived(_call(retry=True), t),
                                     what="the tools/call retried with the answer")
        retried = [m for m in tap.requests("tools/call") if "inputResponses" in m["params"]]
        assert retried[0]["params"]["inputResponses"] == {"approval": {"action": "accept", "content": {}}}, (
            presses, retried)
        assert retried[0]["params"]["requestState"] == asked["requestState"], retried
        done = tap.wait_for(lambda m: m["dir"] == "server" and isinstance(m["msg"], dict)
                            and m["msg"].get("id") == retried[0]["id"] and "result" in m["msg"])["msg"]["result"]
        assert done["isError"] is False and done["structuredContent"]["entry"]["text"] == "Prefers tabs", done
        # one server process: Claude Code retried on the connection it called on
        assert len({m["pid"] for m in tap.messages}) == 1, {m["pid"] for m in tap.messages}
        assert standin.finished.wait(60), "Claude Code never sent the model the result"
    added = standin.result("memory_add")
    assert added.is_error is False and "Prefers tabs" in added.text, added

    async def explain() -> dict[str, Any]:
        async with socket_client(d.socket_path) as raw:
            return dict(await raw.ok("audit/explain", {"target": "Prefers tabs"}))

    life = anyio.run(explain)
    [event] = life["events"]
    assert event["action"] == "add" and event["text"] == "Prefers tabs", event
    decision = event["decision"]
    assert decision["outcome"] == "allowed-once" and decision["by"] == {"kind": "human", "name": "mcp-elicitation"}, (
        decision)
    assert life["current"]["text"] == "Prefers tabs", life


def test_codex_tuis_mcp_command_lists_the_tools_and_resources(daemon_factory: Any, hosts_install: Path,
                                                              tmp_path: Path, standin: StandIn, tap: Tap) -> None:
    d = daemon_factory()
    h = _host("codex", hosts_install, tmp_path, d, tap, standin)
    # --no-daemon: the TUI in its own process, not through an app-server daemon it would
    # start, detached (its own session), in the test's CODEX_HOME, outliving the test
    with Screen([*h.argv(), "--no-daemon"], cwd=h.workspace, env=h.env()) as screen:
        screen.wait_for(lambda t: "› Ask Codex to do anything" in t, what="the prompt")
        screen.type("/mcp verbose")
        screen.wait_for(lambda t: "/mcp verbose" in t, what="the typed command")
        screen.send("Enter")
        shown = screen.wait_for(lambda t: "• memoryd: " in t and "Resource templates" in t.split("• memoryd: ")[1],
                                what="memoryd's listing", joined=True)
    lines = shown.split("• memoryd: ", 1)[1].split("\n\n", 1)[0].splitlines()
    block = {line.strip().removeprefix("• ").partition(": ")[0]: line.strip().partition(": ")[2] for line in lines[1:]}
    assert lines[0] == "connected (8 tools)", shown
    assert block["Tools"].split(", ") == sorted(TOOLS), shown
    assert block["Resources"] == ("Frozen memory snapshot (memory://snapshot), Memory budgets (memory://budgets), "
                                  "Visible memory entries (memory://entries)"), shown



def _elicited(m: dict[str, Any]) -> bool:
    return m["dir"] == "server" and isinstance(m["msg"], dict) and m["msg"].get("method") == "elicitation/create"


def test_codex_tui_shows_the_approval_whole_and_a_person_accepts_it(
        daemon_factory: Any, hosts_install: Path, tmp_path: Path, standin: StandIn, tap: Tap) -> None:
    from rawclient import socket_client

    d = daemon_factory(policy="ask")
    h = _host("codex", hosts_install, tmp_path, d, tap, standin)
    with Screen([*h.argv(), "--no-daemon"], cwd=h.workspace, env=h.env()) as screen:
        screen.wait_for(lambda t: "› Ask Codex to do anything" in t, what="the prompt")
        screen.type('CALL memory_add {"track":"user","scope":"workspace","text":"Prefers tabs"}')
        screen.wait_for(lambda t: "Prefers tabs" in t, what="the typed prompt")
        screen.press_until("Enter", lambda t: tap.arrived(_call(retry=False), t), what="a tools/call", wait=5)
        asked = tap.wait_for(_elicited)["msg"]
        shown = screen.wait_for(lambda t: "enter to submit" in t, what="the approval dialog")
        # the dialog shows the message whole, every line, then its three answers
        on_screen = [line.strip() for line in shown.splitlines()]
        message = [line.strip() for line in asked["params"]["message"].split("\n")]
        start = on_screen.index(message[0])
        assert on_screen[start:start + len(message) + 3] == [
            *message, "› 1. Allow   Allow this request and continue", "2. Deny    Decline this request and continue",
            "3. Cancel  Cancel this request"], shown
        def answered(m: dict[str, Any]) -> bool:
            return (m["dir"] == "host" and isinstance(m["msg"], dict) and m["msg"].get("id") == asked["id"]
                    and "result" in m["msg"])

        # Enter on Allow; pressed again if no answer reached the server within a second
        # (the dialog can drop an Enter that comes as soon as it is drawn: FINDINGS.md)
        presses = screen.press_until("Enter", lambda t: tap.arrived(answered, t), what="the answer")
        answer = tap.wait_for(answered)["msg"]
        assert answer["result"] == {"action": "accept", "content": {}}, (presses, answer)
        [call] = tap.requests("tools/call")
        done = tap.wait_for(lambda m: m["dir"] == "server" and isinstance(m["msg"], dict)
                            and m["msg"].get("id") == call["id"] and "result" in m["msg"])["msg"]["result"]
        assert done["isError"] is False and done["structuredContent"]["entry"]["text"] == "Prefers tabs", done
        assert standin.finished.wait(60), "Codex never sent the model the result"
    added = standin.result("memory_add")
    assert "Prefers tabs" in added.text and "WRITE_DENIED" not in added.text, added

    async def explain() -> dict[str, Any]:
        async with socket_client(d.socket_path) as raw:
            return dict(await raw.ok("audit/explain", {"target": "Prefers tabs"}))

    [event] = anyio.run(explain)["events"]
    assert (event["action"], event["text"], event["decision"]["outcome"], event["decision"]["by"]) == (
        "add", "Prefers tabs", "allowed-once", {"kind": "human", "name": "mcp-elicitation"}), event
