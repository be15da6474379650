"""The batch routes' byte streams, which the Ingress keeps to itself rather than send over a Ray hop: an upload
(`POST /v1/files`, multipart) streamed to the store within its limits, a file's content and a Message Batch's
results streamed out of it, and a Message Batch's body (`POST /v1/messages/batches`) scanned into the batch's
input as it arrives, before the processing makes the batch of it. The store is reached in threads, never on the
event loop. The requests made from the path and query of the other batch routes are here too."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from starlette.requests import Request
from starlette.responses import StreamingResponse

from ..api.errors import APIError, invalid_request, payload_too_large
from ..api import strict_json
from ..batches.files import begin_upload, check_purpose
from ..batches.ids import MESSAGE_BATCH_PREFIX, new_id, owner_of
from ..batches.message_batches import RequestsScanner
from ..batches.records import FileRecord, batch_dir, file_data_path
from ..batches.results import ResultChunks
from ..batches.schemas import (
    BatchRequest, CancelBatchRequest, CreateMessageBatchRequest, DeleteBatchRequest, DeleteFileRequest, FileRequest,
    ListBatchesRequest, ListFilesRequest, query_int,
)
from ..batches.service import BatchService
from ..batches.store import BatchStore, StreamWriter
from ..config.app_args import BatchConfig
from ..generation.caller import Caller
from .browser_guard import check_json_content_type
from .multipart import FormReader

# What a multipart body may hold besides its file: boundaries, part headers, the `purpose` field.
FORM_OVERHEAD_BYTES = 64 * 1024


class BatchEdge:
    """The Ingress's side of the batch routes, over the store at `config.storage`."""

    def __init__(self, store: BatchStore, config: BatchConfig, max_line_bytes: int) -> None:
        self.store = store
        self.config = config
        self.max_line_bytes = max_line_bytes
        self.service = BatchService(store, config)  # lookups only (whose a file or a batch is): no runner here

    async def upload(self, request: Request, caller: Caller) -> FileRecord:
        form = FormReader(request.headers.get("content-type"))
        limit = self.config.max_file_bytes + FORM_OVERHEAD_BYTES
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise payload_too_large(self.config.max_file_bytes)
        upload = await asyncio.to_thread(begin_upload, self.store, self.config, owner_of(caller.key_id))
        fields: dict[str, str] = {}
        filename: str | None = None
        received = 0
        try:
            async for chunk in request.stream():
                received += len(chunk)
                if received > limit:
                    raise payload_too_large(self.config.max_file_bytes)
                events = form.feed(chunk)
                fields.update(events.fields)
                if events.filename is not None:
                    filename = events.filename
                if events.file_data:
                    await asyncio.to_thread(upload.write, b"".join(events.file_data))
            form.finish()
            if form.file_parts == 0:
                raise invalid_request("The form has no `file` part.", param="file")
            purpose = check_purpose(fields.get("purpose"))
            return await asyncio.to_thread(upload.commit, filename or "", purpose)
        except BaseException:
            await asyncio.to_thread(upload.abort)
            raise

    async def content(self, request: Request, caller: Caller) -> StreamingResponse:
        file = await self.service.file_of(caller, request.path_params["file_id"])
        blocks = self.store.blocks(file_data_path(file.owner, file.id))
        return StreamingResponse(_threaded(blocks), media_type="application/octet-stream",
                                 headers={"Content-Length": str(file.bytes)})

    async def create_message_batch(self, request: Request, caller: Caller,
                                   respond: Callable[[Any, Caller], Any]) -> Any:
        """The body's requests written to a new batch's folder as lines, then the batch made of them by the
        processing (`respond`); nothing is left behind when either refuses."""
        check_json_content_type(request.headers.get("content-type"))
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self.config.max_file_bytes:
            raise payload_too_large(self.config.max_file_bytes)
        owner, batch_id = owner_of(caller.key_id), new_id(MESSAGE_BATCH_PREFIX)
        scanner = RequestsScanner(self.max_line_bytes, self.config.max_lines)
        writer: StreamWriter = await asyncio.to_thread(self.store.writer, f"{batch_dir(owner, batch_id)}/input.jsonl")
        received = 0
        try:
            async for chunk in request.stream():
                received += len(chunk)
                if received > self.config.max_file_bytes:
                    raise payload_too_large(self.config.max_file_bytes)
                await asyncio.to_thread(_scan_into, scanner, writer, chunk)
            total = scanner.finish()
            await asyncio.to_thread(writer.commit)
        except BaseException:
            await asyncio.to_thread(writer.abort)
            raise
        try:
            return await respond(CreateMessageBatchRequest(batch_id, total), caller)
        except BaseException:
            await asyncio.to_thread(self.store.delete, batch_dir(owner, batch_id), True)
            raise

    async def message_batch_results(self, request: Request, caller: Caller) -> StreamingResponse:
        record = await self.service.record_of(caller, request.path_params["message_batch_id"], MESSAGE_BATCH_PREFIX)
        if not record.ended:
            raise APIError(f"Batch {record.id} has not ended: its results are ready when `processing_status` is "
                           "`ended`.", status=404, type="invalid_request_error", code="not_found")
        chunks = ResultChunks(self.store, record.owner, record.id)
        lines = (strict_json.dumps_bytes(r.to_anthropic()) + b"\n" for r in chunks.results())
        return StreamingResponse(_threaded(lines), media_type="application/x-jsonl")


def _scan_into(scanner: RequestsScanner, writer: StreamWriter, chunk: bytes) -> None:
    for line in scanner.feed(chunk):
        writer.write(line)


async def _threaded(items: Iterator[bytes]) -> AsyncIterator[bytes]:
    """A blocking iterator (the store's reads) pulled in a thread, item by item, so the event loop never waits."""
    done = object()
    while True:
        item = await asyncio.to_thread(next, items, done)
        if item is done:
            return
        yield item  # type: ignore[misc]


# -- the requests of the routes made from a path and a query -----------------------------------------------------

def list_files_request(request: Request) -> ListFilesRequest:
    query = request.query_params
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise invalid_request("`order` must be `asc` or `desc`.", param="order")
    return ListFilesRequest(purpose=query.get("purpose"), limit=query_int(query.get("limit"), "limit", 10000, 1, 10000),
                            order=order, after=query.get("after"))


def file_request(request: Request) -> FileRequest:
    return FileRequest(request.path_params["file_id"])


def delete_file_request(request: Request) -> DeleteFileRequest:
    return DeleteFileRequest(request.path_params["file_id"])


def list_batches_request(request: Request) -> ListBatchesRequest:
    query = request.query_params
    return ListBatchesRequest(after=query.get("after"), limit=query_int(query.get("limit"), "limit", 20, 1, 100))


def batch_request(request: Request) -> BatchRequest:
    return BatchRequest(request.path_params["batch_id"])


def cancel_batch_request(request: Request) -> CancelBatchRequest:
    return CancelBatchRequest(request.path_params["batch_id"])


def list_message_batches_request(request: Request) -> ListBatchesRequest:
    query = request.query_params
    return ListBatchesRequest(anthropic=True, after=query.get("after_id"), before=query.get("before_id"),
                              limit=query_int(query.get("limit"), "limit", 20, 1, 1000))


def message_batch_request(request: Request) -> BatchRequest:
    return BatchRequest(request.path_params["message_batch_id"], anthropic=True)


def cancel_message_batch_request(request: Request) -> CancelBatchRequest:
    return CancelBatchRequest(request.path_params["message_batch_id"], anthropic=True)


def delete_message_batch_request(request: Request) -> DeleteBatchRequest:
    return DeleteBatchRequest(request.path_params["message_batch_id"])
