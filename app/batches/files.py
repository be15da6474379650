"""Files in the store: an upload streamed to its place within the limits (never held whole), its record written
after its bytes (a file exists once its record does), and the owner's share of the store (files, bytes) checked
before an upload starts. Blocking calls: the HTTP edge runs them in threads."""

from __future__ import annotations

import time
import unicodedata

from ..api.errors import APIError, invalid_request, payload_too_large
from ..config.app_args import BatchConfig
from .ids import FILE_PREFIX, new_id
from .records import FileRecord, file_data_path, file_record_path, files_dir, id_owner_path
from .store import BatchStore, StreamWriter

PURPOSES = ("batch",)
"""What a file may be uploaded for here: batch input (OpenAI's other purposes have no use on this server)."""
MAX_FILENAME = 255


def clean_filename(name: str | None) -> str:
    """A client's file name as kept and shown: its last path part, control characters out, at most 255
    characters ("upload" when nothing is left)."""
    name = (name or "").replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(c for c in name if unicodedata.category(c)[0] != "C")
    return name[:MAX_FILENAME] or "upload"


def check_purpose(purpose: str | None) -> str:
    if purpose not in PURPOSES:
        raise invalid_request(f"`purpose` must be one of {', '.join(PURPOSES)}: files here are batch input.",
                              param="purpose")
    return purpose


class Upload:
    """One file on its way to the store: `write` its bytes (a 413 past the limit, the part written dropped),
    `commit` its record, or `abort`."""

    def __init__(self, store: BatchStore, owner: str, limit: int) -> None:
        self.store, self.owner, self.limit = store, owner, limit
        self.file_id = new_id(FILE_PREFIX)
        self.size = 0
        self._writer: StreamWriter | None = store.writer(file_data_path(owner, self.file_id))

    def write(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.limit:
            self.abort()
            raise payload_too_large(self.limit)
        assert self._writer is not None
        self._writer.write(data)

    def commit(self, filename: str, purpose: str) -> FileRecord:
        assert self._writer is not None
        self._writer.commit()
        self._writer = None
        record = FileRecord(self.file_id, self.owner, self.size, int(time.time()), clean_filename(filename),
                            check_purpose(purpose))
        self.store.put(id_owner_path(self.file_id), self.owner.encode())
        self.store.put(file_record_path(self.owner, self.file_id), record.to_json())
        return record

    def abort(self) -> None:
        if self._writer is not None:
            writer, self._writer = self._writer, None
            writer.abort()


def begin_upload(store: BatchStore, config: BatchConfig, owner: str) -> Upload:
    """An upload for `owner`, once its share of the store has room (a 429 when it has not: delete files first)."""
    sizes = store.sizes(files_dir(owner))
    held = [n for n in sizes if n.endswith(".json")]
    if len(held) >= config.max_files_per_key:
        raise APIError(f"This key keeps {len(held)} files, the most it may (batch.max_files_per_key): delete some "
                       "first.", status=429, type="invalid_request_error", code="too_many_files")
    used = sum(size for name, size in sizes.items() if name.endswith(".data"))
    room = config.max_bytes_per_key - used
    if room <= 0:
        raise APIError(f"This key's files take {used} bytes, the most it may (batch.max_bytes_per_key): delete some "
                       "first.", status=429, type="invalid_request_error", code="storage_limit_reached")
    return Upload(store, owner, min(config.max_file_bytes, room))
