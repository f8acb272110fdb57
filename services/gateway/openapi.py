"""The gateway's OpenAPI 3.1 document, built from the same Structs that decode requests,
so the document cannot drift from what the server accepts."""

from __future__ import annotations

import json
from functools import cache
from typing import Any, Literal

import msgspec

from .protocol import MAX_BATCH, REFUSED, ChatCompletionRequest, CompletionRequest

# -- response shapes, as documentation (the handlers build them in shapes.Shapes) ---------


class PromptTokensDetails(msgspec.Struct, kw_only=True):
    cached_tokens: int


class UsageOut(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class TopLogprobOut(msgspec.Struct, kw_only=True):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprobOut(TopLogprobOut, kw_only=True):
    top_logprobs: list[TopLogprobOut]


class ChatLogprobs(msgspec.Struct, kw_only=True):
    content: list[TokenLogprobOut] | None


class CompletionLogprobs(msgspec.Struct, kw_only=True):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


Finish = Literal["stop", "length"] | None
ChatFinish = Literal["stop", "length", "tool_calls"] | None
"""A chat choice may end calling tools (``auto`` or ``required``)."""


class AssistantMessage(msgspec.Struct, kw_only=True):
    role: Literal["assistant"]
    content: str | None


class ChatChoice(msgspec.Struct, kw_only=True):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: ChatFinish
    stop_reason: str | int | None = None


class ChatCompletion(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageOut


class TextChoice(msgspec.Struct, kw_only=True):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: Finish
    stop_reason: str | int | None = None


class Completion(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[TextChoice]
    usage: UsageOut


class Delta(msgspec.Struct, kw_only=True):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(msgspec.Struct, kw_only=True):
    index: int
    delta: Delta
    logprobs: ChatLogprobs | None
    finish_reason: ChatFinish
    stop_reason: str | int | None = None


class ChatCompletionChunk(msgspec.Struct, kw_only=True):
    """One server-sent event of a chat stream; with stream_options.include_usage the
    last one before ``[DONE]`` has no choices and the usage."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: UsageOut | None = None


class CompletionChunk(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[TextChoice]
    usage: UsageOut | None = None


class ModelCard(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    root: str
    """The weights: ``name@version`` when the model registry versions them."""
    parent: str | None
    """For a LoRA adapter, the base model it runs on."""
    max_model_len: int | None = None


class Version(msgspec.Struct, kw_only=True):
    version: str


class ModelList(msgspec.Struct, kw_only=True):
    object: Literal["list"]
    data: list[ModelCard]


class ErrorDetail(msgspec.Struct, kw_only=True):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(msgspec.Struct, kw_only=True):
    error: ErrorDetail


_REF = "#/components/schemas/{name}"

_ERRORS = {
    "400": "Invalid request: malformed JSON (or JSON nested too deeply), a wrong type or "
    "value, an unsupported parameter, or a prompt over the model's context",
    "401": "Missing or invalid API key",
    "403": "The API key may not use this model",
    "404": "No live worker serves this model",
    "408": "The request body did not arrive within the gateway's body timeout (30 s)",
    "409": "The x-request-id is already in use",
    "413": "The request body is larger than the platform carries: the NATS server's "
    "max_payload (1 MiB by default) less 16 KiB for the event around it, or the gateway's "
    "--max-body-bytes",
    "429": "Rate limit of the API key, the model's queue is full, or its workers would not "
    "start the request within its latency objective (`overloaded`; see Retry-After)",
    "503": "No worker for the model is ready, or the gateway is draining (see Retry-After)",
    "504": "The request's timeout passed",
}


def _error(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "headers": _HEADERS,
        "content": {"application/json": {"schema": {"$ref": _REF.format(name="ErrorResponse")}}},
    }


_HEADERS = {
    "x-request-id": {
        "description": "The request's id (yours, or a new one)",
        "schema": {"type": "string"},
    }
}


def _events(chunk: str) -> dict[str, Any]:
    """Each server-sent event: ``data`` is a JSON chunk (or an error, after which the
    stream ends), and the last event's data is ``[DONE]``."""
    json_data = {
        "type": "string",
        "contentMediaType": "application/json",
        "contentSchema": {
            "oneOf": [
                {"$ref": _REF.format(name=chunk)},
                {"$ref": _REF.format(name="ErrorResponse")},
            ]
        },
    }
    return {
        "type": "object",
        "required": ["data"],
        "properties": {"data": {"anyOf": [{"const": "[DONE]"}, json_data]}},
    }


def _completion_op(summary: str, request: str, response: str, chunk: str) -> dict[str, Any]:
    return {
        "summary": summary,
        "parameters": [
            {
                "name": "x-request-id",
                "in": "header",
                "required": False,
                "description": "Your id for the request (letters, digits, - and _); "
                "reusing one that was already submitted gives 409",
                "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,128}$"},
            },
            {
                "name": "X-Request-Timeout",
                "in": "header",
                "required": False,
                "description": "Seconds the request may take; past them it ends with 504 "
                "deadline_exceeded wherever it is",
                "schema": {"type": "number", "exclusiveMinimum": 0, "maximum": 86400},
            },
        ],
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": _REF.format(name=request)}}},
        },
        "responses": {
            "200": {
                "description": "The completion; with stream=true, server-sent events of "
                "chunks ending with 'data: [DONE]'",
                "headers": _HEADERS,
                "content": {
                    "application/json": {"schema": {"$ref": _REF.format(name=response)}},
                    "text/event-stream": {"schema": _events(chunk)},
                },
            },
            **{code: _error(text) for code, text in _ERRORS.items()},
        },
    }


_ONLY = "Not supported: only {} is accepted (anything else gets 400)."


def _refused() -> dict[str, dict[str, Any]]:
    """vLLM's fields this server refuses (protocol.REFUSED), each at its no-op values:
    the Structs decode them as anything so that the error names the field."""
    out = {}
    for name, (what, no_ops) in REFUSED.items():
        shown = ", ".join(json.dumps(v) for v in no_ops)
        out[name] = {
            "enum": list(no_ops),
            "description": f"Not supported: {what}. Only {shown} is accepted "
            "(anything else gets 400 unsupported_parameter).",
        }
    return out


_TOOL = {
    "type": "object",
    "required": ["function"],
    "properties": {
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string"},
                "description": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                "parameters": {"anyOf": [{"type": "object"}, {"type": "null"}]},
                "strict": {"anyOf": [{"type": "boolean"}, {"type": "null"}]},
            },
        },
    },
}
_UNSUPPORTED_CHAT: dict[str, dict[str, Any]] = {
    "tools": {
        "anyOf": [{"type": "array", "items": _TOOL}, {"type": "null"}],
        "description": "Functions the model may call (served by workers with a tool-call "
        "parser; others answer 400 unsupported_by_engine)",
    },
    "tool_choice": {
        "anyOf": [
            {"enum": ["none", "auto", "required", None]},
            {
                "type": "object",
                "required": ["type", "function"],
                "properties": {
                    "type": {"const": "function"},
                    "function": {
                        "type": "object",
                        "required": ["name"],
                        "properties": {"name": {"type": "string"}},
                    },
                },
            },
        ],
        "description": "auto (the default with tools), none, required, or a function "
        "named in tools",
    },
    "functions": {
        "anyOf": [{"type": "array", "maxItems": 0}, {"type": "null"}],
        "description": _ONLY.format("[]"),
    },
    "function_call": {"enum": ["none", "auto", None], "description": _ONLY.format('"none"')},
}
_TOKEN_IDS = {
    "type": "array",
    "items": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1},
    "minItems": 1,
}
_UNSUPPORTED_COMPLETION: dict[str, dict[str, Any]] = {
    "prompt": {
        "anyOf": [
            {"type": "string"},
            _TOKEN_IDS,
            {
                "type": "array",
                "items": {"anyOf": [{"type": "string"}, _TOKEN_IDS]},
                "minItems": 1,
                "maxItems": MAX_BATCH,
            },
        ],
        "description": "A prompt (text, or token ids of the model's tokenizer) or a batch "
        "of them (each runs as a request of its own; choice i of the answer is prompt "
        "i // n's).",
    },
    "best_of": {"enum": [None], "description": "Taken only equal to n (else 400)."},
    "suffix": {"enum": ["", None], "description": _ONLY.format('""')},
    "add_special_tokens": {"enum": [True, None], "description": _ONLY.format("true")},
}
_UNSUPPORTED_BOTH: dict[str, dict[str, Any]] = {
    "truncation_side": {"enum": ["left", None], "description": _ONLY.format('"left"')},
}
_ECHOING = {"required": ["echo"], "properties": {"echo": {"const": True}}}
_STREAMING = {"required": ["stream"], "properties": {"stream": {"const": True}}}
_RULES_COMPLETION: list[dict[str, Any]] = [
    {  # echo with logprobs (the prompt's) is not streamed
        "if": {
            "required": ["stream", "echo"],
            "properties": {"stream": {"const": True}, "echo": {"const": True}},
        },
        "then": {"properties": {"logprobs": {"type": "null"}}},
    },
    {  # max_tokens 0 scores the prompt: with echo only
        "if": {"required": ["max_tokens"], "properties": {"max_tokens": {"const": 0}}},
        "then": _ECHOING,
    },
    {  # echo repeats text prompts
        "if": _ECHOING,
        "then": {
            "properties": {
                "prompt": {
                    "anyOf": [
                        {"type": "string"},
                        {"type": "array", "items": {"type": "string"}},
                    ]
                },
            }
        },
    },
]
_RULES_CHAT: list[dict[str, Any]] = [
    {  # a tool_choice other than none needs tools
        "if": {
            "required": ["tool_choice"],
            "properties": {
                "tool_choice": {"anyOf": [{"enum": ["auto", "required"]}, {"type": "object"}]}
            },
        },
        "then": {"required": ["tools"], "properties": {"tools": {"type": "array", "minItems": 1}}},
    },
    {  # echo without logprobs
        "if": _ECHOING,
        "then": {"properties": {"logprobs": {"enum": [False, None]}}},
    },
    {  # top_logprobs needs logprobs
        "if": {"required": ["top_logprobs"], "properties": {"top_logprobs": {"minimum": 1}}},
        "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}},
    },
    {  # continuing the last message opens no new turn
        "if": {
            "required": ["continue_final_message"],
            "properties": {"continue_final_message": {"const": True}},
        },
        "then": {
            "required": ["add_generation_prompt"],
            "properties": {"add_generation_prompt": {"const": False}},
        },
    },
]
_RESPONSE_FORMAT = {
    "anyOf": [
        {
            "type": "object",
            "required": ["type"],
            "properties": {"type": {"enum": ["text", "json_object"]}},
        },
        {
            "type": "object",
            "required": ["type", "json_schema"],
            "properties": {
                "type": {"const": "json_schema"},
                "json_schema": {
                    "type": "object",
                    "required": ["schema"],
                    "properties": {
                        "name": {"type": "string"},
                        "description": {"type": "string"},
                        "schema": {"type": "object"},
                        "strict": {"type": ["boolean", "null"]},
                    },
                },
            },
        },
        {
            "type": "object",
            "required": ["type"],
            "properties": {"type": {"const": "structural_tag"}},
            "description": "vLLM's structural tag, passed to the engine whole",
        },
        {"type": "null"},
    ],
    "description": "OpenAI's output formats: text, any JSON object, or a JSON Schema.",
}


def openapi_document(models: tuple[str, ...] = ()) -> dict[str, Any]:
    """The document, with the models served right now as the ``model`` examples."""
    doc = _document()
    if not models:
        return doc
    schemas = dict(doc["components"]["schemas"])
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        props = dict(schemas[name]["properties"])
        props["model"] = {**props["model"], "examples": list(models)}
        schemas[name] = {**schemas[name], "properties": props}
    return {**doc, "components": {**doc["components"], "schemas": schemas}}


@cache
def _document() -> dict[str, Any]:
    _, components = msgspec.json.schema_components(
        [
            ChatCompletionRequest,
            CompletionRequest,
            ChatCompletion,
            Completion,
            ModelList,
            ModelCard,
            Version,
            ErrorResponse,
            ChatCompletionChunk,
            CompletionChunk,
        ],
        ref_template=_REF,
    )
    for name, extra in (
        ("ChatCompletionRequest", _UNSUPPORTED_CHAT),
        ("CompletionRequest", _UNSUPPORTED_COMPLETION),
    ):
        props = components[name]["properties"]
        overrides = {**_refused(), **_UNSUPPORTED_BOTH, **extra}
        overrides["response_format"] = _RESPONSE_FORMAT
        for field, override in overrides.items():
            if field not in props:
                continue  # a chat-only refusal, on the completions body
            props[field] = {
                **override,
                **({"default": props[field]["default"]} if "default" in props[field] else {}),
            }
    components["ChatCompletionRequest"]["allOf"] = _RULES_CHAT
    components["CompletionRequest"]["allOf"] = _RULES_COMPLETION
    stream_options = components["StreamOptions"]["properties"]
    stream_options["continuous_usage_stats"] = {
        "enum": [False],
        "description": _ONLY.format("false"),
        "default": False,
    }
    components["StructuredOutputsIn"]["description"] = (
        "vLLM's structured_outputs: exactly one of json, regex, choice, grammar, "
        "json_object, structural_tag"
    )
    components["StructuredOutputsIn"]["properties"]["json"] = {
        "anyOf": [{"type": "object"}, {"type": "null"}],
        "description": "A JSON Schema (its JSON text in a string is taken too)",
        "default": None,
    }
    components["StructuredOutputsIn"]["oneOf"] = [
        {"required": [k], "properties": {k: {"not": {"type": "null"}}}}
        for k in ("json", "regex", "choice", "grammar", "structural_tag")
    ] + [{"required": ["json_object"], "properties": {"json_object": {"const": True}}}]
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "inferbus gateway",
            "version": "1",
            "description": "OpenAI-compatible completions over the inferbus platform.",
        },
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}, {}],
        "paths": {
            "/v1/chat/completions": {
                "post": _completion_op(
                    "Create a chat completion",
                    "ChatCompletionRequest",
                    "ChatCompletion",
                    "ChatCompletionChunk",
                )
            },
            "/v1/completions": {
                "post": _completion_op(
                    "Create a text completion", "CompletionRequest", "Completion", "CompletionChunk"
                )
            },
            "/v1/models/{model}": {
                "get": {
                    "summary": "One model live workers serve",
                    "parameters": [
                        {
                            "name": "model",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string"},
                        }
                    ],
                    "responses": {
                        "200": {
                            "description": "The model",
                            "headers": _HEADERS,
                            "content": {
                                "application/json": {
                                    "schema": {"$ref": _REF.format(name="ModelCard")}
                                }
                            },
                        },
                        "401": _error(_ERRORS["401"]),
                        "404": _error(
                            "No live worker serves this model (or the key may not see it)"
                        ),
                    },
                }
            },
            "/health": {
                "get": {
                    "summary": "200 while the gateway serves, 503 while it drains (vLLM's)",
                    "responses": {
                        "200": {"description": "Serving"},
                        "503": {"description": "Draining"},
                    },
                }
            },
            "/ping": {
                "get": {
                    "summary": "As /health (SageMaker's)",
                    "responses": {
                        "200": {"description": "Serving"},
                        "503": {"description": "Draining"},
                    },
                }
            },
            "/version": {
                "get": {
                    "summary": "The platform's version",
                    "responses": {
                        "200": {
                            "description": "The version",
                            "content": {
                                "application/json": {
                                    "schema": {"$ref": _REF.format(name="Version")}
                                }
                            },
                        }
                    },
                }
            },
            "/v1/models": {
                "get": {
                    "summary": "Models live workers serve (those the API key may use)",
                    "responses": {
                        "200": {
                            "description": "The models",
                            "headers": _HEADERS,
                            "content": {
                                "application/json": {
                                    "schema": {"$ref": _REF.format(name="ModelList")}
                                }
                            },
                        },
                        "401": _error(_ERRORS["401"]),
                    },
                }
            },
        },
    }
