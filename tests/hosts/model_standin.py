"""A scripted stand-in for the model an agent host talks to, on 127.0.0.1.

It speaks the three wire APIs the hosts use: Anthropic's Messages API (Claude Code),
Gemini's generateContent / streamGenerateContent (Gemini CLI) and OpenAI's Responses API
(Codex), streaming (SSE) or not. It has no model: the host's prompt is the script. Each
line ``CALL <tool> <json arguments>`` of the user's prompt is one tool call, made in order,
one per model turn (``<tool>`` is the MCP tool's own name; the stand-in calls it under
whatever name the host lists it, e.g. ``mcp__memoryd__memory_add``); once every call has
its result in the conversation, the turn is a final text, ``DONE``, and the host exits.

Everything is recorded for the test (:class:`StandIn`'s attributes): every request, the
tool list of each scripted turn (names and input schemas, as the host sent them), the
system text, and each tool result the host handed back (its text and error flag).
Requests that are not the conversation (a title, a quota probe, a classifier, a token
count) get a short answer and are recorded too.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

JSON = dict[str, Any]

CALL = re.compile(r"^CALL (\w+) (\{.*\})\s*$", re.MULTILINE)
DONE = "DONE"


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class ToolResult:
    """A tool result as the host handed it back to the model."""

    tool: str  # the MCP tool's name (the call the stand-in made)
    text: str  # its text, as the model reads it
    is_error: bool | None  # the host's error flag (None: the API has none)
    raw: Any  # the result part of the request, untouched


@dataclass
class Turn:
    """One scripted conversation turn: what the host sent, what the stand-in answered."""

    api: str
    tools: dict[str, JSON]  # name as the host lists it → its input schema, as sent
    system: str
    body: Any
    answer: str  # "call <host tool name>" or the final text


@dataclass
class StandIn:
    requests: list[Request] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    results: list[ToolResult] = field(default_factory=list)
    #: the scripted calls not made because the host lists no such tool
    missing: list[str] = field(default_factory=list)
    port: int = 0
    #: set once a scripted conversation got its final text
    finished: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> StandIn:
        standin = self

        class Handler(_Handler):
            owner = standin

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="model-standin", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None and self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    # --- what the test reads -------------------------------------------------------------

    @property
    def tools(self) -> dict[str, JSON]:
        """The tool list of the first scripted turn: host name → input schema."""
        assert self.turns, f"the host never sent a scripted turn; requests: {[r.path for r in self.requests]}"
        return self.turns[0].tools

    def result(self, tool: str, index: int = 0) -> ToolResult:
        found = [r for r in self.results if r.tool == tool]
        assert len(found) > index, (f"no result #{index} of {tool} reached the model; results: "
                                    f"{[(r.tool, r.text[:200]) for r in self.results]}; missing: {self.missing}")
        return found[index]

    # --- the conversation ----------------------------------------------------------------

    def answer(self, api: str, body: Any, tools: dict[str, JSON], system: str, texts: list[str],
               results: list[tuple[str, str, bool | None, Any]]) -> tuple[str, JSON | str]:
        """The next move: ("call", {"name", "arguments"}) or ("text", text)."""
        calls = [(m.group(1), m.group(2)) for t in texts for m in CALL.finditer(t)]
        with self._lock:
            done = len(results)
            # the results are in the conversation in call order: name each by its call. A
            # conversation only grows, so the longest one seen holds every result so far (a
            # host's side request, e.g. one it sends again or a shorter one in parallel, does
            # not take results away)
            if done >= len(self.results):
                self.results[:] = [ToolResult(name, text, is_error, raw)
                                   for (name, _), (_, text, is_error, raw) in zip(calls, results, strict=False)]
            while done < len(calls):
                name, args = calls[done]
                host_name = _host_name(name, tools)
                if host_name is None:
                    self.missing.append(name)
                    done += 1
                    continue
                self.turns.append(Turn(api, tools, system, body, f"call {host_name}"))
                return "call", {"name": host_name, "arguments": json.loads(args)}
            final = DONE if not self.missing else f"{DONE}; not listed by the host: {', '.join(self.missing)}"
            self.turns.append(Turn(api, tools, system, body, final))
            self.finished.set()
            return "text", final


def _host_name(tool: str, tools: dict[str, JSON]) -> str | None:
    """The name the host lists ``tool`` under (exactly, or with a server prefix)."""
    if tool in tools:
        return tool
    found = [n for n in tools if n.endswith(tool) and "memoryd" in n]
    return found[0] if len(found) == 1 else None


def _text_of(content: Any) -> str:
    """The text of a message content / tool output (a string or a list of parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_text_of(part) for part in content)
    if isinstance(content, dict):
        for key in ("text", "output", "content"):
            if key in content:
                return _text_of(content[key])
        return json.dumps(content)
    return "" if content is None else str(content)


# --- Anthropic Messages API ---------------------------------------------------------------

def _anthropic(owner: StandIn, body: JSON) -> tuple[str, JSON | str] | None:
    tools = {t["name"]: t.get("input_schema", {}) for t in body.get("tools", []) if "name" in t}
    if not any("memoryd" in n for n in tools):
        return None
    texts: list[str] = []
    results: list[tuple[str, str, bool | None, Any]] = []
    for message in body.get("messages", []):
        content = message.get("content")
        if message.get("role") != "user":
            continue
        if isinstance(content, str):
            texts.append(content)
            continue
        for part in content or []:
            if part.get("type") == "text":
                texts.append(part.get("text", ""))
            elif part.get("type") == "tool_result":
                results.append(("", _text_of(part.get("content")), bool(part.get("is_error", False)), part))
    system = _text_of(body.get("system"))
    return owner.answer("anthropic", body, tools, system, texts, results)


def _anthropic_message(model: str, move: tuple[str, JSON | str], n: int) -> JSON:
    kind, what = move
    if kind == "call":
        assert isinstance(what, dict)
        block: JSON = {"type": "tool_use", "id": f"toolu_{n:04d}", "name": what["name"], "input": what["arguments"]}
        stop = "tool_use"
    else:
        block = {"type": "text", "text": what}
        stop = "end_turn"
    return {"id": f"msg_{n:04d}", "type": "message", "role": "assistant", "model": model, "content": [block],
            "stop_reason": stop, "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 5, "cache_creation_input_tokens": 0,
                      "cache_read_input_tokens": 0}}


def _anthropic_events(message: JSON) -> list[tuple[str, JSON]]:
    start = {**message, "content": [], "stop_reason": None}
    events: list[tuple[str, JSON]] = [("message_start", {"type": "message_start", "message": start})]
    for i, block in enumerate(message["content"]):
        if block["type"] == "tool_use":
            events.append(("content_block_start", {"type": "content_block_start", "index": i,
                                                    "content_block": {**block, "input": {}}}))
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        else:
            events.append(("content_block_start", {"type": "content_block_start", "index": i,
                                                    "content_block": {"type": "text", "text": ""}}))
            delta = {"type": "text_delta", "text": block["text"]}
        events.append(("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta}))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
    events.append(("message_delta", {"type": "message_delta",
                                     "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                                     "usage": {"output_tokens": 5}}))
    events.append(("message_stop", {"type": "message_stop"}))
    return events


# --- Gemini API ---------------------------------------------------------------------------

def _gemini(owner: StandIn, body: JSON) -> tuple[str, JSON | str] | None:
    tools: dict[str, JSON] = {}
    for group in body.get("tools", []) or []:
        for decl in group.get("functionDeclarations", []) or []:
            tools[decl["name"]] = decl.get("parametersJsonSchema", decl.get("parameters", {}))
    if not any("memory_" in n for n in tools):
        return None
    texts: list[str] = []
    results: list[tuple[str, str, bool | None, Any]] = []
    for content in body.get("contents", []):
        for part in content.get("parts", []) or []:
            if content.get("role") == "user" and "text" in part:
                texts.append(part["text"])
            if "functionResponse" in part:
                response = part["functionResponse"].get("response", {})
                is_error = "error" in response if isinstance(response, dict) else None
                results.append(("", _text_of(response), is_error, part))
    system = _text_of((body.get("systemInstruction") or {}).get("parts"))
    return owner.answer("gemini", body, tools, system, texts, results)


def _gemini_response(model: str, body: JSON, move: tuple[str, JSON | str] | None) -> JSON:
    if move is None:
        config = body.get("generationConfig") or {}
        if config.get("responseMimeType") == "application/json" or "responseJsonSchema" in config:
            # the host's own classifiers (next speaker, model routing): the dullest answer
            text = json.dumps({"reasoning": "scripted", "next_speaker": "user", "model_choice": "flash",
                               "complexity_reasoning": "scripted", "complexity_score": 1})
        else:
            text = "ok"
        parts: list[JSON] = [{"text": text}]
    elif move[0] == "call":
        assert isinstance(move[1], dict)
        parts = [{"functionCall": {"name": move[1]["name"], "args": move[1]["arguments"]}}]
    else:
        parts = [{"text": move[1]}]
    return {"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15},
            "modelVersion": model}


# --- OpenAI Responses API -----------------------------------------------------------------

def _openai_tools(tools: list[Any], prefix: str = "") -> dict[str, JSON]:
    out: dict[str, JSON] = {}
    for t in tools:
        if not isinstance(t, dict):
            continue
        if t.get("type") == "function" and "name" in t:
            out[prefix + t["name"]] = t.get("parameters", {})
        elif isinstance(t.get("tools"), list):  # a namespace of tools: "namespace/name"
            out.update(_openai_tools(t["tools"], f"{t.get('name', '')}/"))
    return out


def _openai(owner: StandIn, body: JSON) -> tuple[str, JSON | str] | None:
    tools = _openai_tools(body.get("tools", []) or [])
    if not any("memoryd" in n for n in tools):
        return None
    texts: list[str] = []
    results: list[tuple[str, str, bool | None, Any]] = []
    items = body.get("input", [])
    for item in items if isinstance(items, list) else [{"role": "user", "content": items}]:
        if item.get("type") in ("message", None) and item.get("role") == "user":
            texts.append(_text_of(item.get("content")))
        elif item.get("type") in ("function_call_output", "custom_tool_call_output"):
            output = item.get("output")
            results.append(("", _text_of(output), None, item))
    system = _text_of(body.get("instructions")) + "\n" + "\n".join(
        _text_of(i.get("content")) for i in items if isinstance(i, dict) and i.get("role") in ("developer", "system"))
    return owner.answer("openai", body, tools, system, texts, results)


def _openai_events(model: str, move: tuple[str, JSON | str] | None, n: int) -> list[tuple[str, JSON]]:
    if move is not None and move[0] == "call":
        assert isinstance(move[1], dict)
        name: str = move[1]["name"]
        namespace, _, name = name.rpartition("/")
        item: JSON = {"type": "function_call", "id": f"fc_{n:04d}", "call_id": f"call_{n:04d}", "name": name,
                      "arguments": json.dumps(move[1]["arguments"]), "status": "completed"}
        if namespace:
            item["namespace"] = namespace
    else:
        text = "ok" if move is None else str(move[1])
        item = {"type": "message", "role": "assistant", "id": f"msg_{n:04d}", "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}]}
    response = {"id": f"resp_{n:04d}", "object": "response", "model": model, "status": "completed", "output": [item],
                "usage": {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 5,
                          "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 15}}
    return [("response.created", {"type": "response.created", "response": {**response, "status": "in_progress",
                                                                             "output": []}}),
            ("response.output_item.added", {"type": "response.output_item.added", "output_index": 0, "item": item}),
            ("response.output_item.done", {"type": "response.output_item.done", "output_index": 0, "item": item}),
            ("response.completed", {"type": "response.completed", "response": response})]


# --- HTTP ---------------------------------------------------------------------------------

class _Handler(BaseHTTPRequestHandler):
    owner: StandIn
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _record(self, body: Any) -> None:
        with self.owner._lock:
            self.owner.requests.append(Request(self.command, self.path, dict(self.headers.items()), body))

    def _json(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _sse(self, events: list[tuple[str | None, JSON]]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        for name, data in events:
            head = f"event: {name}\n" if name else ""
            self.wfile.write(f"{head}data: {json.dumps(data)}\n\n".encode())
        self.wfile.flush()
        self.close_connection = True

    def do_GET(self) -> None:
        self._record(None)
        path = self.path.split("?")[0]
        if path.endswith("/models"):  # a model catalogue: none to offer beyond the one configured
            self._json(200, {"object": "list", "data": [], "models": []})
        else:
            self._json(404, {"error": {"message": f"stand-in: no {path}", "type": "not_found_error"}})

    def do_HEAD(self) -> None:
        self._record(None)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body: Any = json.loads(raw) if raw else {}
        except ValueError:
            body = raw.decode(errors="replace")
        self._record(body)
        path = self.path.split("?")[0]
        n = len(self.owner.requests)
        if not isinstance(body, dict):
            self._json(400, {"error": {"message": "stand-in: not JSON"}})
        elif path.endswith("/messages/count_tokens"):
            self._json(200, {"input_tokens": 10})
        elif path.endswith("/messages"):
            model = str(body.get("model", "claude"))
            move = _anthropic(self.owner, body) or ("text", "ok")
            message = _anthropic_message(model, move, n)
            if body.get("stream"):
                self._sse(list(_anthropic_events(message)))  # type: ignore[arg-type]
            else:
                self._json(200, message)
        elif ":countTokens" in path:
            self._json(200, {"totalTokens": 10})
        elif ":generateContent" in path or ":streamGenerateContent" in path:
            model = path.rsplit("/", 1)[-1].split(":")[0]
            reply = _gemini_response(model, body, _gemini(self.owner, body))
            if ":streamGenerateContent" in path:
                self._sse([(None, reply)])
            else:
                self._json(200, reply)
        elif path.endswith("/responses"):
            model = str(body.get("model", "gpt"))
            self._sse(list(_openai_events(model, _openai(self.owner, body), n)))  # type: ignore[arg-type]
        else:
            self._json(404, {"error": {"message": f"stand-in: no {path}", "type": "not_found_error"}})
