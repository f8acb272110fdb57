"""The gateway's OpenAPI 3.1 document, built from the same Structs that decode requests,
so the document cannot drift from what the server accepts."""

from __future__ import annotations

from functools import cache
from typing import Any, Literal

import msgspec

from .core import ChatCompletionRequest, CompletionRequest

# -- response shapes, as documentation (the handlers build them in core.Shapes) -----------


class UsageOut(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(msgspec.Struct, kw_only=True):
    role: Literal["assistant"]
    content: str | None


class ChatChoice(msgspec.Struct, kw_only=True):
    index: int
    message: AssistantMessage
    logprobs: None
    finish_reason: Literal["stop", "length"] | None


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
    logprobs: None
    finish_reason: Literal["stop", "length"] | None


class Completion(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[TextChoice]
    usage: UsageOut


class ModelCard(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: int | None = None


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
    "400": "Invalid request: malformed JSON, a wrong type or value, an unsupported parameter, "
           "or a prompt over the model's context",
    "401": "Missing or invalid API key",
    "403": "The API key may not use this model",
    "404": "No live worker serves this model",
    "409": "The x-request-id is already in use",
    "429": "Rate limit of the API key, or the model's queue is full (see Retry-After)",
    "503": "No worker for the model is ready, or the gateway is draining (see Retry-After)",
    "504": "The request's timeout passed",
}


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "headers": _HEADERS,
            "content": {"application/json": {"schema": {"$ref": _REF.format(name="ErrorResponse")}}}}


_HEADERS = {"x-request-id": {"description": "The request's id (yours, or a new one)",
                             "schema": {"type": "string"}}}


def _completion_op(summary: str, request: str, response: str) -> dict[str, Any]:
    return {
        "summary": summary,
        "parameters": [
            {"name": "x-request-id", "in": "header", "required": False,
             "description": "Your id for the request (letters, digits, - and _); "
                            "reusing one that was already submitted gives 409",
             "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,128}$"}},
            {"name": "X-Request-Timeout", "in": "header", "required": False,
             "description": "Seconds the request may take; past them it ends with 504 "
                            "deadline_exceeded wherever it is",
             "schema": {"type": "number", "exclusiveMinimum": 0, "maximum": 86400}},
        ],
        "requestBody": {"required": True, "content": {
            "application/json": {"schema": {"$ref": _REF.format(name=request)}}}},
        "responses": {
            "200": {"description": "The completion; with stream=true, server-sent events of "
                                   "chunks ending with 'data: [DONE]'",
                    "headers": _HEADERS,
                    "content": {"application/json": {"schema": {"$ref": _REF.format(name=response)}},
                                "text/event-stream": {"schema": {"type": "string"}}}},
            **{code: _error(text) for code, text in _ERRORS.items()},
        },
    }


@cache
def openapi_document() -> dict[str, Any]:
    _, components = msgspec.json.schema_components(
        [ChatCompletionRequest, CompletionRequest, ChatCompletion, Completion, ModelList,
         ErrorResponse], ref_template=_REF)
    return {
        "openapi": "3.1.0",
        "info": {"title": "inferbus gateway", "version": "1",
                 "description": "OpenAI-compatible completions over the inferbus platform."},
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}, {}],
        "paths": {
            "/v1/chat/completions": {"post": _completion_op(
                "Create a chat completion", "ChatCompletionRequest", "ChatCompletion")},
            "/v1/completions": {"post": _completion_op(
                "Create a text completion", "CompletionRequest", "Completion")},
            "/v1/models": {"get": {
                "summary": "Models live workers serve (those the API key may use)",
                "responses": {
                    "200": {"description": "The models", "headers": _HEADERS, "content": {
                        "application/json": {"schema": {"$ref": _REF.format(name="ModelList")}}}},
                    "401": _error(_ERRORS["401"]),
                },
            }},
        },
    }
