"""OpenAI-shaped errors: every failure the server reports is ``{"error": {message, type, param, code}}``.

Bad input is a 400 that names the parameter (pydantic's validation errors, ``SamplingParams``'s
ValueErrors, a prompt the engine cannot take, malformed JSON); an unknown route is a 404 and a wrong
method a 405 in the same shape; anything unexpected is a 500 that says so, never a bare traceback.
FastAPI's default 422 for validation errors becomes a 400, as OpenAI's API answers.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger(__name__)

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                405: "invalid_request_error", 503: "service_unavailable_error"}


class OpenAIError(Exception):
    def __init__(self, message: str, *, status: int = 400, param: str | None = None, code: str | None = None,
                 error_type: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.error_type = error_type or _ERROR_TYPES.get(status, "server_error" if status >= 500 else
                                                         "invalid_request_error")

    def to_dict(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.error_type, "param": self.param,
                          "code": self.code}}

    def to_response(self) -> JSONResponse:
        return JSONResponse(self.to_dict(), status_code=self.status)


def validation_error(exc: RequestValidationError) -> OpenAIError:
    """The first pydantic error, as a 400 naming its parameter (``messages[0].content``)."""
    errors = exc.errors()
    if not errors:
        return OpenAIError("invalid request body", code="invalid_request")
    first = _most_specific(errors)
    if first.get("type") == "json_invalid":
        return OpenAIError(f"the request body is not valid JSON: {first.get('ctx', {}).get('error', first['msg'])}",
                           code="invalid_json")
    location = [part for part in first.get("loc", ()) if part != "body"]
    # Union members add their type name to the location (prompt.str, prompt.list[int]); keep the field.
    location = [part for part in location if not (isinstance(part, str) and ("[" in part or part in
                                                                              ("str", "int", "float", "bool")))]
    param = None
    for part in location:
        if isinstance(part, int):
            param = f"{param}[{part}]"
        else:
            param = part if param is None else f"{param}.{part}"
    if first.get("type") == "missing":
        message = f"missing required parameter: {param!r}" if param else "the request has no JSON body"
        return OpenAIError(message, param=param, code="missing_required_parameter")
    value = first.get("input")
    if param is None and isinstance(value, bytes):
        # FastAPI hands the raw bytes over when the Content-Type is not JSON (a missing one is read as JSON).
        return OpenAIError("the request body must be a JSON object sent with Content-Type: application/json",
                           code="invalid_content_type")
    shown = repr(value) if not isinstance(value, (dict, list)) or len(repr(value)) < 200 else type(value).__name__
    where = f"{param}: " if param else ""
    # Our validators' messages are complete sentences; pydantic's "Value error, " prefix adds nothing.
    message = first["msg"].removeprefix("Value error, ")
    return OpenAIError(f"{where}{message} (got {shown})", param=param, code="invalid_value")


def _most_specific(errors: list[dict[str, Any]]) -> dict[str, Any]:
    """The first error, unless it is one member's of a union (``input`` may be a text or a list of items): then
    the deepest error about the same field, which says what is wrong inside the value the client meant (a list's
    item) rather than that it is not a text."""
    first = errors[0]
    location = first.get("loc", ())
    if not any(part in _UNION_MEMBER_NAMES for part in location):
        return first
    field = location[:2] if location[:1] == ("body",) else location[:1]
    same_field = [error for error in errors if tuple(error.get("loc", ()))[:len(field)] == tuple(field)]
    return max(same_field, key=lambda error: len(error.get("loc", ())))


_UNION_MEMBER_NAMES = ("str", "int", "float", "bool")


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OpenAIError)
    async def _openai_error(request: Request, exc: OpenAIError) -> JSONResponse:
        return exc.to_response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_error(exc).to_response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        status = exc.status_code
        if status == 404:
            message = f"no route {request.method} {request.url.path}"
        else:
            message = str(exc.detail) if exc.detail else HTTPStatus(status).phrase
        return OpenAIError(message, status=status, code=HTTPStatus(status).phrase.lower().replace(" ", "_")
                           ).to_response()

    @app.exception_handler(Exception)
    async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error in %s %s", request.method, request.url.path)
        return OpenAIError(f"internal server error: {exc!r}", status=500, error_type="internal_server_error",
                           code="internal_error").to_response()
