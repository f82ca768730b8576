"""The gateway's one error shape: ``{"error": message, "code": code, ...}`` with the
project's error codes, and the HTTP answer to each exception a route can meet."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaException
from fastapi.responses import JSONResponse

from pyrula_stream.errors import (
    BrokerUnavailableError,
    ErrorCode,
    PyrulaError,
    ThreadDeleteFailed,
    UnknownTopicError,
    UserError,
)
from pyrula_stream.gateway.options import AppOptions
from pyrula_stream.kafka.connection_log import is_connection_failure


class GatewayRefusal(PyrulaError):
    """A request the gateway answers with ``status`` and the error JSON."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: ErrorCode,
        headers: Mapping[str, str] | None = None,
        errors: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(message, code=code)
        self.status = status
        self.headers = dict(headers or {})
        self.errors = errors


def error_body(message: str, code: ErrorCode | str, **extra: Any) -> dict[str, Any]:
    """The one JSON shape of every error: ``{"error": message, "code": code, ...}`` (the
    same two keys the guard's 401/403/421 answers carry)."""
    return {"error": message, "code": str(code), **extra}


def refusal_of(exc: BaseException, options: AppOptions) -> GatewayRefusal:
    """The HTTP answer to an exception of a route (or of a stream before it started)."""
    if isinstance(exc, GatewayRefusal):
        return exc
    retry = {"Retry-After": str(options.retry_after_s)}
    if isinstance(exc, BrokerUnavailableError) or (
        isinstance(exc, KafkaException) and is_connection_failure(exc)
    ):
        return GatewayRefusal(
            503,
            f"Kafka is not reachable: {exc}",
            code=ErrorCode.STORE_UNAVAILABLE,
            headers=retry,
        )
    if isinstance(exc, KafkaException):
        return GatewayRefusal(503, f"Kafka: {exc}", code=ErrorCode.STORE_UNAVAILABLE, headers=retry)
    if isinstance(exc, UnknownTopicError):
        return GatewayRefusal(404, str(exc), code=ErrorCode.NOT_FOUND)
    if isinstance(exc, ThreadDeleteFailed):
        status = 504 if exc.code == ErrorCode.WAIT_TIMEOUT else 409
        return GatewayRefusal(status, str(exc), code=exc.code or ErrorCode.INTERNAL)
    if isinstance(exc, TimeoutError):
        return GatewayRefusal(504, str(exc) or "timed out", code=ErrorCode.WAIT_TIMEOUT)
    if isinstance(exc, UserError):
        return GatewayRefusal(400, str(exc), code=ErrorCode.INVALID_REQUEST)
    if isinstance(exc, PyrulaError):
        return GatewayRefusal(500, str(exc), code=exc.code or ErrorCode.INTERNAL)
    return GatewayRefusal(500, f"internal error ({type(exc).__name__})", code=ErrorCode.INTERNAL)


def refusal_response(refusal: GatewayRefusal) -> JSONResponse:
    extra: dict[str, Any] = {}
    if refusal.errors is not None:
        extra["errors"] = refusal.errors
        if refusal.errors:
            extra["field"] = refusal.errors[0].get("field")
    code = refusal.code or ErrorCode.INTERNAL
    return JSONResponse(
        error_body(refusal.message, code, **extra),
        status_code=refusal.status,
        headers=refusal.headers,
    )


def not_found(what: str) -> GatewayRefusal:
    return GatewayRefusal(404, f"{what} not found", code=ErrorCode.NOT_FOUND)


def invalid(field: str, why: str) -> GatewayRefusal:
    return GatewayRefusal(
        422,
        f"{field}: {why}",
        code=ErrorCode.INVALID_REQUEST,
        errors=[{"field": field, "message": why}],
    )
