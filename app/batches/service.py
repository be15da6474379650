"""The batch routes' answers on the processing's side (registered with the Processor, app/serving/processing.py):
batches made, read, listed, cancelled and deleted, files read, listed and deleted, in OpenAI's shapes and in
Anthropic's. Uploads, downloads and a Message Batch's body are byte streams the Ingress keeps to itself (app/http/
batch_routes.py); this side sees only their records.

A key sees only its own: every lookup goes to the caller's own folder of the store, so another key's id is a 404
like a missing one. An admin key (and the one caller of a server without keys) sees every key's. Making a batch
writes its record and its `open/` marker, then tells the runner (`Runner.submit`); a runner that cannot be told
finds it at its next look at the store."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from ..api.errors import APIError, invalid_request, not_found
from ..config.app_args import BatchConfig
from ..generation.caller import Caller
from .endpoints import ENDPOINTS, MESSAGES
from .ids import BATCH_PREFIX, FILE_PREFIX, MESSAGE_BATCH_PREFIX, new_id, owner_of, valid_id, valid_owner
from .records import (
    BatchRecord, FileRecord, batch_dir, batch_record_path, batches_dir, file_data_path, file_record_path, files_dir,
    id_owner_path, open_marker, rfc3339,
)
from .schemas import (
    BatchRequest, CancelBatchRequest, CreateBatchRequest, CreateMessageBatchRequest, DeleteBatchRequest,
    DeleteFileRequest, FileRequest, ListBatchesRequest, ListFilesRequest,
)
from .store import BatchStore

log = logging.getLogger("llamaray.batches")


class Runner(Protocol):
    """How the processing tells the batch runner (deployments/batch_runner.py) what changed. Best effort: a runner
    away now finds the store's open batches when it is back."""

    async def submit(self, owner: str, batch_id: str) -> None: ...

    async def cancel(self, owner: str, batch_id: str) -> None: ...


class NoRunner:
    async def submit(self, owner: str, batch_id: str) -> None:
        pass

    async def cancel(self, owner: str, batch_id: str) -> None:
        pass


def sees_all(caller: Caller) -> bool:
    """An admin key sees every key's batches and files (a server without keys has one caller: its own are all)."""
    return caller.policy is not None and caller.policy.admin


class BatchService:
    def __init__(self, store: BatchStore, config: BatchConfig, runner: Runner | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.config = config
        self.runner = runner or NoRunner()
        self.clock = clock

    async def _io(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.to_thread(fn, *args)

    # -- whose is it -------------------------------------------------------------------------------------------------
    async def owner(self, caller: Caller, any_id: str, prefix: str) -> str | None:
        """The owner of `any_id` as far as `caller` may know: its own key's, or for an admin any key's; None when
        the caller may not see it (or it does not exist, or is no id of ours: all alike)."""
        if not valid_id(any_id, prefix):
            return None
        if sees_all(caller):
            blob = await self._io(self.store.get, id_owner_path(any_id))
            owner = blob.decode() if blob else ""
            return owner if valid_owner(owner) else None
        return owner_of(caller.key_id)

    async def record_of(self, caller: Caller, batch_id: str, prefix: str) -> BatchRecord:
        owner = await self.owner(caller, batch_id, prefix)
        blob = await self._io(self.store.get, batch_record_path(owner, batch_id)) if owner else None
        if blob is None:
            raise not_found(f"No batch found with id '{batch_id[:80]}'.")
        return BatchRecord.from_json(blob)

    async def _cancel_asked(self, record: BatchRecord) -> float | None:
        if record.ended:
            return None
        blob = await self._io(self.store.get, f"{batch_dir(record.owner, record.id)}/cancel")
        return float(blob) if blob else None

    async def _shown(self, record: BatchRecord) -> dict[str, Any]:
        asked = await self._cancel_asked(record)
        if record.protocol == "anthropic":
            body = record.to_anthropic(cancel_asked=asked is not None)
            if asked is not None and body["cancel_initiated_at"] is None:
                body["cancel_initiated_at"] = rfc3339(asked)
            return body
        body = record.to_openai(cancel_asked=asked is not None)
        if asked is not None:
            body.setdefault("cancelling_at", int(asked))
        return body

    # -- making a batch ---------------------------------------------------------------------------------------------
    async def create(self, request: CreateBatchRequest, caller: Caller) -> dict[str, Any]:
        """OpenAI's `POST /v1/batches`: the input file must be the caller's own, uploaded for `batch`; its lines
        are checked by the runner (the batch is `validating` until then, `failed` naming its lines if one is bad)."""
        if request.endpoint not in ENDPOINTS:
            raise invalid_request(f"`endpoint` {request.endpoint!r} is not one this server runs batches for: "
                                  f"{', '.join(ENDPOINTS)}.", param="endpoint", code="unsupported_value")
        owner = owner_of(caller.key_id)
        file = await self._file(owner, request.input_file_id) if valid_id(request.input_file_id, FILE_PREFIX) else None
        if file is None:
            raise APIError(f"No file found with id '{request.input_file_id[:80]}'.", status=404, param="input_file_id",
                           type="invalid_request_error", code="not_found")
        if file.purpose != "batch":
            raise invalid_request(f"File {file.id} was not uploaded with `purpose: batch`.", param="input_file_id")
        return (await self._open(owner, caller, BATCH_PREFIX, "openai", request.endpoint, file.id,
                                 request.metadata)).to_openai()

    async def create_message_batch(self, request: CreateMessageBatchRequest, caller: Caller) -> dict[str, Any]:
        """Anthropic's `POST /v1/messages/batches`, whose requests the Ingress wrote to the batch's folder."""
        owner = owner_of(caller.key_id)
        if not valid_id(request.batch_id, MESSAGE_BATCH_PREFIX) or not await self._io(
                self.store.exists, f"{batch_dir(owner, request.batch_id)}/input.jsonl"):
            raise invalid_request("The batch's requests were not received.", param="requests")
        record = await self._open(owner, caller, MESSAGE_BATCH_PREFIX, "anthropic", MESSAGES.url, None, None,
                                  batch_id=request.batch_id, total=request.total)
        return record.to_anthropic()

    async def _open(self, owner: str, caller: Caller, prefix: str, protocol: str, endpoint: str,
                    input_file_id: str | None, metadata: dict[str, str] | None,
                    batch_id: str | None = None, total: int = 0) -> BatchRecord:
        open_now = [n for n in await self._io(self.store.names, "open") if n.startswith(owner + ".")]
        if len(open_now) >= self.config.max_open_batches_per_key:
            raise APIError(f"This key has {len(open_now)} batches not yet ended, the most it may "
                           "(batch.max_open_batches_per_key): wait for one to end, or cancel one.", status=429,
                           type="invalid_request_error", code="too_many_open_batches")
        now = self.clock()
        policy = caller.policy
        record = BatchRecord(id=batch_id or new_id(prefix), owner=owner, protocol=protocol, endpoint=endpoint,
                             created_at=now, expires_at=now + self.config.completion_window_s,
                             input_file_id=input_file_id, metadata=metadata, total=total,
                             key_sha256=policy.key_sha256 if policy is not None else None,
                             policy=policy.model_dump(mode="json") if policy is not None else None)
        await self._io(self.store.put, id_owner_path(record.id), owner.encode())
        await self._io(self.store.put, batch_record_path(owner, record.id), record.to_json())
        await self._io(self.store.put, open_marker(owner, record.id), b"")
        await self._tell("submit", owner, record.id)
        return record

    async def _tell(self, what: str, owner: str, batch_id: str) -> None:
        try:
            await getattr(self.runner, what)(owner, batch_id)
        except Exception as exc:  # noqa: BLE001 - the runner finds it in the store at its next look
            log.warning("batch %s: the runner was not told (%s): %r; it will find it in the store", batch_id, what,
                        exc)

    # -- reading, listing, cancelling ------------------------------------------------------------------------------
    async def retrieve(self, request: BatchRequest, caller: Caller) -> dict[str, Any]:
        prefix = MESSAGE_BATCH_PREFIX if request.anthropic else BATCH_PREFIX
        return await self._shown(await self.record_of(caller, request.batch_id, prefix))

    async def cancel(self, request: CancelBatchRequest, caller: Caller) -> dict[str, Any]:
        prefix = MESSAGE_BATCH_PREFIX if request.anthropic else BATCH_PREFIX
        record = await self.record_of(caller, request.batch_id, prefix)
        if record.status in ("completed", "failed", "expired"):
            raise APIError(f"Batch {record.id} has ended ({record.status}): there is nothing to cancel.", status=409,
                           type="invalid_request_error", code="batch_ended")
        if not record.ended and await self._cancel_asked(record) is None:
            await self._io(self.store.put, f"{batch_dir(record.owner, record.id)}/cancel",
                           repr(self.clock()).encode())
            await self._tell("cancel", record.owner, record.id)
        return await self._shown(record)

    async def list(self, request: ListBatchesRequest, caller: Caller) -> dict[str, Any]:
        prefix = MESSAGE_BATCH_PREFIX if request.anthropic else BATCH_PREFIX
        owners = await self._owners(caller)
        ids: list[tuple[str, str]] = []  # (id, owner), newest first
        for owner in owners:
            ids += [(name, owner) for name in await self._io(self.store.names, batches_dir(owner))
                    if name.startswith(prefix)]
        ids.sort(reverse=True)
        names = [i for i, _ in ids]
        start, end = 0, len(ids)
        if request.after:
            start = names.index(request.after) + 1 if request.after in names else len(names)
        if request.before:
            end = names.index(request.before) if request.before in names else 0
            start = max(start, end - request.limit) if not request.after else start
        page = ids[start:min(end, start + request.limit)]
        records = []
        for batch_id, owner in page:
            blob = await self._io(self.store.get, batch_record_path(owner, batch_id))
            if blob is not None:
                records.append(await self._shown(BatchRecord.from_json(blob)))
        has_more = start + len(page) < end if not request.before else start > 0
        first = records[0]["id"] if records else None
        last = records[-1]["id"] if records else None
        if request.anthropic:
            return {"data": records, "has_more": has_more, "first_id": first, "last_id": last}
        body: dict[str, Any] = {"object": "list", "data": records, "has_more": has_more}
        if records:
            body.update(first_id=first, last_id=last)
        return body

    async def delete_message_batch(self, request: DeleteBatchRequest, caller: Caller) -> dict[str, Any]:
        record = await self.record_of(caller, request.batch_id, MESSAGE_BATCH_PREFIX)
        if not record.ended:
            raise invalid_request(f"Batch {record.id} is still being processed: cancel it, and delete it once it "
                                  "has ended.")
        await self._io(self.store.delete, batch_dir(record.owner, record.id), True)
        await self._io(self.store.delete, id_owner_path(record.id))
        return {"id": record.id, "type": "message_batch_deleted"}

    async def _owners(self, caller: Caller) -> list[str]:
        if sees_all(caller):
            return [n for n in await self._io(self.store.names, "keys") if valid_owner(n)]
        return [owner_of(caller.key_id)]

    # -- files -------------------------------------------------------------------------------------------------------
    async def _file(self, owner: str, file_id: str) -> FileRecord | None:
        blob = await self._io(self.store.get, file_record_path(owner, file_id))
        return FileRecord.from_json(blob) if blob is not None else None

    async def file_of(self, caller: Caller, file_id: str) -> FileRecord:
        """The caller's file (an admin's: anyone's), or the 404 of a missing one."""
        owner = await self.owner(caller, file_id, FILE_PREFIX)
        file = await self._file(owner, file_id) if owner else None
        if file is None:
            raise not_found(f"No file found with id '{file_id[:80]}'.")
        return file

    async def retrieve_file(self, request: FileRequest, caller: Caller) -> dict[str, Any]:
        return (await self.file_of(caller, request.file_id)).to_openai()

    async def delete_file(self, request: DeleteFileRequest, caller: Caller) -> dict[str, Any]:
        file = await self.file_of(caller, request.file_id)
        for name in await self._io(self.store.names, "open"):
            owner, _, batch_id = name.partition(".")
            if owner != file.owner:
                continue
            blob = await self._io(self.store.get, batch_record_path(owner, batch_id))
            if blob is not None and BatchRecord.from_json(blob).input_file_id == file.id:
                raise APIError(f"File {file.id} is the input of batch {batch_id}, which has not ended: cancel it or "
                               "wait for its end.", status=409, type="invalid_request_error", code="file_in_use")
        await self._io(self.store.delete, file_record_path(file.owner, file.id))
        await self._io(self.store.delete, file_data_path(file.owner, file.id))
        await self._io(self.store.delete, id_owner_path(file.id))
        return {"id": file.id, "object": "file", "deleted": True}

    async def list_files(self, request: ListFilesRequest, caller: Caller) -> dict[str, Any]:
        ids: list[tuple[str, str]] = []
        for owner in await self._owners(caller):
            ids += [(name[:-5], owner) for name in await self._io(self.store.names, files_dir(owner))
                    if name.endswith(".json")]
        ids.sort(reverse=request.order != "asc")
        names = [i for i, _ in ids]
        start = names.index(request.after) + 1 if request.after and request.after in names else (
            len(names) if request.after else 0)
        data: list[dict[str, Any]] = []
        more = False
        for file_id, owner in ids[start:]:
            file = await self._file(owner, file_id)
            if file is None or (request.purpose is not None and file.purpose != request.purpose):
                continue
            if len(data) == request.limit:
                more = True
                break
            data.append(file.to_openai())
        return {"object": "list", "data": data, "first_id": data[0]["id"] if data else "",
                "last_id": data[-1]["id"] if data else "", "has_more": more}


Answers = dict[type, Callable[[Any, Caller], Awaitable[dict[str, Any]]]]


async def _off(request: Any, caller: Caller) -> dict[str, Any]:
    raise not_found("Batch jobs are off on this server (batch.enabled: false).")


def answers(service: BatchService | None) -> Answers:
    """Each batch route's request type and the method that answers it (what the Processor registers); with no
    service (batch jobs off), a 404 for each."""
    if service is None:
        return dict.fromkeys(answers(BatchService.__new__(BatchService)), _off)
    return {
        CreateBatchRequest: service.create,
        BatchRequest: service.retrieve,
        CancelBatchRequest: service.cancel,
        ListBatchesRequest: service.list,
        FileRequest: service.retrieve_file,
        DeleteFileRequest: service.delete_file,
        ListFilesRequest: service.list_files,
        CreateMessageBatchRequest: service.create_message_batch,
        DeleteBatchRequest: service.delete_message_batch,
    }
