"""OpenAI's Responses API over the chat path, free of I/O: a request body becomes a
chat completions body (its input items as messages, after the conversation its
``previous_response_id`` stored, its tools and text format in the chat forms), so
that every range, refusal and conversion of the chat path holds for it too; the
answer becomes a Response object, whole or as the API's stream of events, and the
record the next turn continues from."""

from __future__ import annotations

from typing import Any

import msgspec

from inferbus.contracts import RequestFinished, TokenChunk, ToolCallDelta

from .errors import ApiError
from .protocol import unsupported
from .shapes import Answer

RESPONSE_FIELDS = (
    "store",
    "previous_response_id",
    "instructions",
    "input",
    "max_output_tokens",
    "text",
    "reasoning",
    "metadata",
    "tools",
    "tool_choice",
    "background",
    "include",
    "max_tool_calls",
    "prompt",
    "truncation",
    "service_tier",
    "top_logprobs",
    "conversation",
    "prompt_cache_key",
    "safety_identifier",
    "enable_response_messages",
    "previous_input_messages",
    "stream_options",
)
"""Fields of the Responses API that are not the chat API's (read here; the rest of a
body is a chat body's and goes through the chat path as it is)."""


class StoredResponse(msgspec.Struct, kw_only=True):
    """What a stored response keeps (JetStream KV, by response id): the Response
    object, and the conversation a next turn continues (chat messages: the earlier
    turns, this one's input and its answer; not the instructions, which OpenAI does
    not carry over)."""

    response: dict[str, Any]
    messages: list[dict[str, Any]]
    tenant: str = ""
    """Whose it is: only that tenant's keys read, continue or delete it."""


class Turn(msgspec.Struct, kw_only=True):
    """One Responses request, read: the chat body it runs as, and what the answer's
    object and record need."""

    chat: dict[str, Any]
    messages: list[dict[str, Any]]
    """The conversation without the instructions (what a record keeps)."""
    store: bool
    stream: bool
    echo_fields: dict[str, Any]
    """The request's settings a Response object repeats."""


def _text(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise ApiError(400, "content is text or a list of parts", param=where, code="invalid_value")
    out = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text", "refusal"):
            raise unsupported(f"{where}[{i}].type", f"content parts of type {kind!r}")
        out.append(str(part.get("text") or part.get("refusal") or ""))
    return "".join(out)


def input_messages(items: Any) -> list[dict[str, Any]]:
    """The ``input`` (text, or a list of items) as chat messages: function calls join
    the assistant's turn before them, function outputs become tool messages."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise ApiError(400, "input is text or a list of items", param="input", code="invalid_value")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise ApiError(400, "an input item is an object", param=where, code="invalid_value")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise ApiError(400, f"role {role!r}", param=f"{where}.role", code="invalid_value")
            out.append({"role": role, "content": _text(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "")},
            }
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":  # the same turn's calls
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id"),
                    "content": _text(output, f"{where}.output"),
                }
            )
        elif kind == "reasoning":
            continue  # the model's own reasoning of an earlier turn: not shown again
        else:
            raise unsupported(f"{where}.type", f"input items of type {kind!r}")
    return out


def _tools(tools: Any) -> list[dict[str, Any]]:
    out = []
    for i, tool in enumerate(tools or ()):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise unsupported(f"tools[{i}].type", f"tools of type {kind!r} (function tools only)")
        keys = ("name", "description", "parameters", "strict")
        function = {k: tool[k] for k in keys if k in tool}
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> Any:
    if choice is None or isinstance(choice, str):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    kind = choice.get("type") if isinstance(choice, dict) else choice
    raise unsupported("tool_choice", f"tool_choice of type {kind!r}")


def _response_format(text: Any) -> dict[str, Any] | None:
    fmt = (text or {}).get("format") if isinstance(text, dict) else None
    if fmt is None or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "description", "schema", "strict") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise unsupported("text.format.type", f"text format {fmt.get('type')!r}")


_REFUSED_SET: dict[str, tuple[str, tuple[Any, ...]]] = {
    "background": ("background responses", (None, False)),
    "max_tool_calls": ("max_tool_calls", (None,)),
    "prompt": ("stored prompt templates", (None,)),
    "conversation": ("conversations (send previous_response_id)", (None,)),
    "truncation": ('truncation "auto"', (None, "disabled")),
    "top_logprobs": ("logprobs in the Responses API (the chat API has them)", (None, 0)),
    "include": ("include", (None, [])),
    "enable_response_messages": ("enable_response_messages", (None, False)),
    "previous_input_messages": ("previous_input_messages", (None, [])),
}


def read_turn(body: bytes, earlier: StoredResponse | None) -> Turn:
    """A Responses body (and the stored turn its ``previous_response_id`` names) as the
    chat body it runs as. The chat path then checks and converts that body."""
    try:
        raw = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise ApiError(400, f"malformed JSON: {exc}", code="invalid_json") from None
    if not isinstance(raw, dict):
        raise ApiError(400, "the body is a JSON object", code="invalid_json")
    for name, (what, no_ops) in _REFUSED_SET.items():
        value = raw.get(name)
        if not any(value == v and type(value) is type(v) for v in no_ops) and value is not None:
            raise unsupported(name, what)
    if "input" not in raw:
        raise ApiError(400, "input is required", param="input", code="missing_required_parameter")
    if raw.get("previous_response_id") is not None and earlier is None:
        raise ApiError(500, "the earlier response was not loaded", code="internal_error")
    history = list(earlier.messages) if earlier is not None else []
    messages = [*history, *input_messages(raw["input"])]
    instructions = raw.get("instructions")
    system = [{"role": "system", "content": instructions}] if instructions else []
    chat = {k: v for k, v in raw.items() if k not in RESPONSE_FIELDS}
    chat["messages"] = [*system, *messages]
    if raw.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = raw["max_output_tokens"]
    if raw.get("tools"):
        chat["tools"] = _tools(raw["tools"])
    if raw.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(raw["tool_choice"])
    fmt = _response_format(raw.get("text"))
    if fmt is not None:
        chat["response_format"] = fmt
    effort = (raw.get("reasoning") or {}).get("effort")
    if effort is not None:
        chat["reasoning_effort"] = effort
    echo = {
        "instructions": instructions,
        "max_output_tokens": raw.get("max_output_tokens"),
        "metadata": raw.get("metadata") or {},
        "parallel_tool_calls": raw.get("parallel_tool_calls", True),
        "previous_response_id": raw.get("previous_response_id"),
        "temperature": raw.get("temperature", 1.0),
        "top_p": raw.get("top_p", 1.0),
        "tool_choice": raw.get("tool_choice", "auto"),
        "tools": raw.get("tools") or [],
        "text": raw.get("text") or {"format": {"type": "text"}},
        "reasoning": raw.get("reasoning"),
        "store": raw.get("store", True) is not False,
        "user": raw.get("user"),
    }
    return Turn(
        chat=chat,
        messages=messages,
        store=echo["store"],
        stream=bool(raw.get("stream")),
        echo_fields=echo,
    )


class _Item:
    """One output item as it streams: reasoning, a message, or a function call."""

    __slots__ = ("call_id", "id", "kind", "name", "parts", "position")

    def __init__(self, kind: str, item_id: str, position: int) -> None:
        self.kind = kind
        self.id = item_id
        self.position = position
        self.parts: list[str] = []
        self.call_id = ""
        self.name = ""

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def as_output(self, status: str = "completed") -> dict[str, Any]:
        if self.kind == "message":
            part = {"type": "output_text", "text": self.text, "annotations": [], "logprobs": []}
            return {
                "type": "message",
                "id": self.id,
                "status": status,
                "role": "assistant",
                "content": [part] if status == "completed" else [],
            }
        if self.kind == "reasoning":
            content = [{"type": "reasoning_text", "text": self.text}]
            return {
                "type": "reasoning",
                "id": self.id,
                "summary": [],
                "content": content if status == "completed" else [],
            }
        return {
            "type": "function_call",
            "id": self.id,
            "call_id": self.call_id,
            "name": self.name,
            "arguments": self.text if status == "completed" else "",
            "status": status,
        }


class ResponseShapes:
    """A Response object and its stream of events, from the turn's chunks (choice 0;
    the Responses API has one answer). Streaming or not, the items are the same."""

    def __init__(
        self, *, request_id: str, model: str, created: int, turn: Turn, tenant: str = ""
    ) -> None:
        self.id = f"resp_{request_id}"
        self.tenant = tenant
        self.request_id = request_id
        self.model = model
        self.created = created
        self.turn = turn
        self._items: list[_Item] = []
        self._message: _Item | None = None
        self._reasoning: _Item | None = None
        self._calls: dict[int, _Item] = {}
        self._seq = 0
        self.final: dict[str, Any] | None = None
        """The Response object once the answer ended."""

    # -- the object ------------------------------------------------------------------

    def _object(self, status: str, output: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": self.model,
            "output": output,
            "error": None,
            "incomplete_details": None,
            "usage": None,
            **self.turn.echo_fields,
        }

    def _item(self, kind: str, events: list[bytes], call_id: str = "", name: str = "") -> _Item:
        prefix = {"message": "msg", "reasoning": "rs", "function_call": "fc"}[kind]
        item = _Item(kind, f"{prefix}_{self.request_id}_{len(self._items)}", len(self._items))
        item.call_id, item.name = call_id, name
        self._items.append(item)
        events.append(self._whole("response.output_item.added", item, "in_progress"))
        if kind == "message":
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            events.append(
                self._event("response.content_part.added", item, content_index=0, part=part)
            )
        return item

    def _event(self, kind: str, of: _Item | None = None, **fields: Any) -> bytes:
        """An SSE event of the stream (``of``: the item it is about, by id and place)."""
        body: dict[str, Any] = {"type": kind, "sequence_number": self._seq}
        self._seq += 1
        if of is not None:
            body["item_id"] = of.id
            body["output_index"] = of.position
        body.update(fields)
        return b"event: " + kind.encode() + b"\ndata: " + msgspec.json.encode(body) + b"\n\n"

    def _whole(self, kind: str, item: _Item, status: str = "completed") -> bytes:
        """An item's added or done event: the item itself, at its place."""
        return self._event(kind, output_index=item.position, item=item.as_output(status))

    def _take(self, chunk: TokenChunk, events: list[bytes]) -> None:
        if chunk.index:
            return
        if chunk.reasoning:
            if self._reasoning is None:
                self._reasoning = self._item("reasoning", events)
            self._reasoning.parts.append(chunk.reasoning)
            events.append(
                self._event(
                    "response.reasoning_text.delta",
                    self._reasoning,
                    content_index=0,
                    delta=chunk.reasoning,
                )
            )
        if chunk.text:
            if self._message is None:
                self._message = self._item("message", events)
            self._message.parts.append(chunk.text)
            events.append(
                self._event(
                    "response.output_text.delta",
                    self._message,
                    content_index=0,
                    delta=chunk.text,
                    logprobs=[],
                )
            )
        for piece in chunk.tool_calls:
            call = self._calls.get(piece.index)
            if call is None:
                call = self._calls[piece.index] = self._item(
                    "function_call", events, piece.id or "", piece.name or ""
                )
            call.parts.append(piece.arguments)
            if piece.arguments:
                events.append(
                    self._event(
                        "response.function_call_arguments.delta", call, delta=piece.arguments
                    )
                )

    def _close(self, item: _Item, events: list[bytes]) -> None:
        if item.kind == "message":
            part = item.as_output()["content"][0]
            events += [
                self._event("response.output_text.done", item, content_index=0, text=item.text),
                self._event("response.content_part.done", item, content_index=0, part=part),
            ]
        elif item.kind == "reasoning":
            text = item.text
            events.append(
                self._event("response.reasoning_text.done", item, content_index=0, text=text)
            )
        else:
            events.append(
                self._event(
                    "response.function_call_arguments.done",
                    item,
                    arguments=item.text,
                    name=item.name,
                )
            )
        events.append(self._whole("response.output_item.done", item))

    def _ended(self, fin: RequestFinished) -> dict[str, Any]:
        end = fin.choice_ends()[0]
        status = "incomplete" if end.finish_reason == "length" else "completed"
        if not self._items:  # an empty answer is an empty message
            self._message = self._item("message", [])
        response = self._object(status, [i.as_output() for i in self._items])
        if status == "incomplete":
            response["incomplete_details"] = {"reason": "max_output_tokens"}
        u = fin.usage
        response["usage"] = {
            "input_tokens": u.prompt_tokens,
            "input_tokens_details": {"cached_tokens": u.cached_prompt_tokens},
            "output_tokens": u.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u.total_tokens,
        }
        self.final = response
        return response

    # -- the presenter the gateway drives ---------------------------------------------

    def opening(self) -> bytes:
        started = self._object("in_progress", [])
        return self._event("response.created", response=started) + self._event(
            "response.in_progress", response=started
        )

    def chunk_event(self, chunk: TokenChunk) -> bytes:
        events: list[bytes] = []
        self._take(chunk, events)
        return b"".join(events)

    def end_events(self, fin: RequestFinished) -> bytes:
        events: list[bytes] = []
        for item in self._items:
            self._close(item, events)
        response = self._ended(fin)
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        events.append(self._event(kind, response=response))
        return b"".join(events)

    def failed_events(self, error: ApiError) -> bytes:
        failed = self._object("failed", [i.as_output() for i in self._items])
        failed["error"] = {"code": error.code or "server_error", "message": error.message}
        return self._event("response.failed", response=failed)

    def complete(self, answer: Answer, fin: RequestFinished) -> dict[str, Any]:
        index = 0
        chunks = [
            TokenChunk(
                request_id=self.request_id,
                seq=0,
                text=answer.text(index),
                reasoning="".join(answer.reasoning.get(index, ())),
            )
        ]
        for call_index, call in sorted(answer.calls.get(index, {}).items()):
            chunks.append(
                TokenChunk(
                    request_id=self.request_id,
                    seq=0,
                    text="",
                    tool_calls=[
                        ToolCallDelta(
                            index=call_index,
                            id=call.id,
                            name=call.name,
                            arguments="".join(call.arguments),
                        )
                    ],
                )
            )
        for chunk in chunks:
            self._take(chunk, [])
        return self._ended(fin)

    def record(self) -> StoredResponse | None:
        """What a next turn continues from (None: not to be stored)."""
        if self.final is None or not self.turn.store:
            return None
        answer: dict[str, Any] = {"role": "assistant", "content": None}
        if self._message is not None:
            answer["content"] = self._message.text
        calls = [i for i in self._items if i.kind == "function_call"]
        if calls:
            answer["tool_calls"] = [
                {
                    "id": c.call_id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.text},
                }
                for c in calls
            ]
        return StoredResponse(
            response=self.final, messages=[*self.turn.messages, answer], tenant=self.tenant
        )
