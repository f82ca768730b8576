"""Large inputs through the gateway: a streamed upload becomes a payload reference.

``POST <prefix>/<agent>/uploads`` takes the raw bytes of one document (any content type),
hashes them while they arrive and spools them to a temporary file (memory stays small
whatever the size), refuses them with ``413`` once past the caller's limit, and puts them
in the gateway's object store under their content address. The answer is the reference,
``{"$pyrula_ref": {...}}``, which the caller puts as a parameter's value in its turn.

Uploads live with the agent's other objects (``<topic prefix>.<agent>/uploads/``), so
the agent's sweep (``pyrula-stream objects sweep``) deletes one that no turn references
once past its grace. With API keys each principal uploads into its own space
(``.../uploads/<principal>/``) and a turn may only reference what its own key uploaded to
that agent: a reference is a capability, and one principal cannot hand the worker
another's document by guessing or copying its key.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import tempfile
from typing import IO, Any, Protocol, runtime_checkable

from fastapi import Request

from pyrula_stream.errors import ErrorCode, MalformedRecordError
from pyrula_stream.gateway.errors import GatewayRefusal
from pyrula_stream.objects.store import ObjectStore
from pyrula_stream.objects.sweep import object_prefix
from pyrula_stream.wire.payload_refs import PayloadRef, refs_in

UPLOADS = "uploads/"
SPOOL_BYTES = 1024 * 1024
"""An upload past this waits in a temporary file rather than in memory."""
DEFAULT_CONTENT_TYPE = "application/octet-stream"


@runtime_checkable
class FileStore(Protocol):
    """A store that uploads from a file without reading it whole (``S3ObjectStore``)."""

    def put_file(self, key: str, file: IO[bytes], content_type: str) -> None: ...


def upload_space(topic_prefix: str, agent: str, principal: str | None) -> str:
    """The key prefix of ``principal``'s uploads to ``agent`` (everyone's without keys),
    under the agent's objects, where its sweep looks."""
    space = object_prefix(topic_prefix, agent) + UPLOADS
    return space if principal is None else f"{space}{principal}/"


def digest_key(digest: str, prefix: str) -> str:
    """The content address of bytes whose sha256 is ``digest``: ``content_key``'s rule,
    for bytes hashed as they streamed in."""
    return f"{prefix}{digest[:2]}/{digest}"


def too_large(limit: int, principal: str | None) -> GatewayRefusal:
    whose = (
        f"the upload limit of API key '{principal}'"
        if principal is not None
        else "the gateway's upload limit"
    )
    return GatewayRefusal(
        413,
        f"the upload is over {limit} bytes, {whose} (max_upload_bytes, or upload_limits / "
        "--upload-limit NAME=BYTES for one key)",
        code=ErrorCode.INVALID_REQUEST,
    )


async def receive_upload(
    request: Request, store: ObjectStore, space: str, limit: int, principal: str | None
) -> PayloadRef:
    """Stream the request's body into ``store`` under the key prefix ``space``; its
    reference."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(limit, principal)
    content_type = request.headers.get("content-type") or DEFAULT_CONTENT_TYPE
    digest = hashlib.sha256()
    size = 0
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as spool:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large(limit, principal)
            digest.update(chunk)
            if size > SPOOL_BYTES:
                await asyncio.to_thread(spool.write, chunk)  # the disk, off the loop
            else:
                spool.write(chunk)
        if content_type.startswith("application/json"):
            await _check_json(spool, store, space, principal)
        sha = digest.hexdigest()
        ref = PayloadRef(store.name, digest_key(sha, space), size, sha, content_type)
        spool.seek(0)
        await asyncio.to_thread(_put, store, ref, spool)
    return ref


async def _check_json(
    spool: IO[bytes], store: ObjectStore, space: str, principal: str | None
) -> None:
    """A JSON upload is read back as JSON, references and all: the references inside it
    pass the same check as a turn's (or one key could reach another's uploads)."""
    spool.seek(0)
    try:
        value = await asyncio.to_thread(json.load, spool)
    except ValueError as exc:
        raise GatewayRefusal(
            400,
            f"the upload says application/json but is not JSON: {exc}",
            code=ErrorCode.INVALID_REQUEST,
        ) from None
    await check_references(value, store, space, principal)


def _put(store: ObjectStore, ref: PayloadRef, file: IO[bytes]) -> None:
    if isinstance(store, FileStore):
        store.put_file(ref.key, file, ref.content_type)
    else:
        store.put(ref.key, file.read(), ref.content_type)


async def check_references(
    params: Any, store: ObjectStore | None, space: str, principal: str | None
) -> None:
    """Every reference in a submitted turn names an object of this gateway's store that
    is there and, with keys, that the caller uploaded (under ``space``, its uploads to
    the agent); ``422`` naming the reference otherwise."""
    try:
        refs = list(refs_in(params))
    except MalformedRecordError as exc:
        raise _bad_ref("", str(exc)) from None
    if not refs:
        return
    if store is None:
        raise _bad_ref(refs[0].key, "cannot be read: this gateway has no object store")
    for ref in refs:
        if ref.store != store.name:
            raise _bad_ref(ref.key, f"names store {ref.store!r}; this gateway has {store.name!r}")
        if principal is not None and not ref.key.startswith(space):
            raise _bad_ref(ref.key, f"is not an upload of API key '{principal}' to this agent")
        if not await asyncio.to_thread(store.exists, ref.key):
            raise _bad_ref(ref.key, "names no stored object: upload it first (POST .../uploads)")


def _bad_ref(key: str, why: str) -> GatewayRefusal:
    message = f"payload reference {key} {why}" if key else why
    return GatewayRefusal(
        422,
        message,
        code=ErrorCode.INVALID_REQUEST,
        errors=[{"field": "$pyrula_ref", "message": message}],
    )
