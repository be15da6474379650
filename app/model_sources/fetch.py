"""Fetch a remote model source into this node's cache, once per node: under a node-wide file lock,
after a free-space check, with progress, a sha256 check when one is configured, and the file moved into
place only when whole, never a file llama.cpp would load. The Hub goes through huggingface_hub (its
cache, token, endpoint and offline mode; it resumes a broken connection within one try but drops its
partial file when the try fails); buckets and URLs through fsspec, into `<file>.part` that the next try
resumes when it is provably the same object's first bytes (see _copy). Without the Hub or network, the
cache's copy is used (cached.py)."""

from __future__ import annotations

import base64
import errno
import hashlib
import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from filelock import Timeout

from .cache import DiskFull, check_free_space, hub_cache, lock, url_dir
from .cached import cached_file, cached_pin
from .progress import Progress
from .redact import redacted, userinfo, without_userinfo
from .source import ModelSource
from .splits import split_parts

log = logging.getLogger("llamaray.model_sources")

Reason = Literal["not_found", "auth", "checksum", "disk_full", "network", "offline"]
# Failures that a later try cannot fix without a change of config, secrets or files: not retried.
LASTING: frozenset[str] = frozenset({"not_found", "auth", "checksum"})
CHUNK = 8 << 20
LOCK_POLL_S = 2.0


class FetchError(RuntimeError):
    """Why a source could not be fetched: `reason` (one of Reason) and a message that names the source
    (credentials hidden: the message goes to /health, 503s and logs)."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(redacted(message))
        self.reason = reason

    @property
    def lasting(self) -> bool:
        return self.reason in LASTING


def hub_endpoint() -> str | None:
    """$HF_ENDPOINT as it is now (huggingface_hub reads it once, at import)."""
    return os.environ.get("HF_ENDPOINT") or None


def fetch(source: ModelSource, root: Path, progress: Progress, *, sha256: str | None = None) -> Path:
    """The local path of `source` (for a split model, its first part, the others beside it)."""
    with _node_lock(root, source.key(), progress):
        if source.kind != "hf":
            return _fetch_url(source, root, progress, sha256)
        path = _fetch_hub(source, root, progress)
        if sha256:
            # A mismatching Hub file stays in huggingface_hub's cache: its blob may be shared (by content)
            # with other files and revisions; it is named by the Hub's own hash, so fetching again would
            # give the same bytes.
            verify_sha256(path, sha256, root)
        return path


@contextmanager
def _node_lock(root: Path, key: str, progress: Progress) -> Iterator[None]:
    held = lock(root, key)
    while True:
        try:
            held.acquire(timeout=LOCK_POLL_S)
            break
        except Timeout:
            progress.wait("another replica on this node is downloading it; waiting for that copy")
    try:
        yield
    finally:
        held.release()


def verify_sha256(path: Path, expected: str, root: Path, *, remove_bad: bool = False) -> None:
    """FetchError("checksum") when the file's sha256 is not `expected` (`remove_bad`: delete it then, for a
    download not yet in place). A file that matched once is remembered by its inode, size and modification
    time (a rename keeps them), so a restart does not hash gigabytes again."""
    expected = expected.lower()
    real = Path(os.path.realpath(path))
    stat = real.stat()
    marker = root / "verified" / expected
    stamp = f"{stat.st_dev}:{stat.st_ino}\t{stat.st_size}\t{stat.st_mtime_ns}"
    if marker.is_file() and marker.read_text() == stamp:
        return
    digest = hashlib.sha256()
    with open(real, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    actual = digest.hexdigest()
    if actual != expected:
        if remove_bad:
            real.unlink(missing_ok=True)
        name = path.name.removesuffix(".part")
        raise FetchError("checksum", f"checksum mismatch for {name}: sha256 {actual}, the config says {expected}")
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(stamp)


# --- the Hugging Face Hub ------------------------------------------------------------------------------


def _fetch_hub(source: ModelSource, root: Path, progress: Progress) -> Path:
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url, try_to_load_from_cache

    assert source.filename, "a quantization tag is resolved to a file at build time"
    parts = split_parts(source.filename)
    cache = hub_cache(root)
    where = f"{source.repo}/{source.filename}"
    try:
        missing = [p for p in parts if not isinstance(
            try_to_load_from_cache(source.repo, p, cache_dir=cache, revision=source.revision), str)]
        if missing:
            sizes = [get_hf_file_metadata(hf_hub_url(source.repo, p, revision=source.revision,
                                                     endpoint=hub_endpoint())).size or 0 for p in missing]
            check_free_space(cache, sum(sizes))
            progress.begin(sum(sizes))
        paths = [hf_hub_download(source.repo, p, revision=source.revision, cache_dir=cache, endpoint=hub_endpoint(),
                                 tqdm_class=_progress_bar(progress)) for p in parts]
    except Exception as exc:  # noqa: BLE001 - every failure becomes a FetchError with its reason
        error = hub_error(exc, where)
        if error.reason in ("offline", "network"):
            # No Hub: a source the builder could not pin (it had no network either) is found among the
            # cache's snapshots, which have no ref for a revision downloaded by commit.
            held = cached_pin(source, root)
            local = cached_file(held, root) if held is not None else None
            if local is not None:
                log.info("%s: the Hub cannot be reached; using this node's cached copy (commit %s)",
                         source.shown(), held.revision)
                return local
        raise error from exc
    return Path(paths[0])


def _progress_bar(progress: Progress) -> type:
    """A stand-in for tqdm that huggingface_hub drives (a class that is not its tqdm gets only its counts)."""

    class Bar:
        def __init__(self, *_: Any, initial: int = 0, **__: Any) -> None:
            if initial:
                progress.advance(initial)

        def update(self, n: int = 1) -> None:
            progress.advance(n)

        def close(self) -> None:
            pass

        def __enter__(self) -> "Bar":
            return self

        def __exit__(self, *exc: Any) -> None:
            pass

    return Bar


def hub_error(exc: Exception, where: str) -> FetchError:
    from huggingface_hub.errors import (
        EntryNotFoundError, GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled,
        RepositoryNotFoundError, RevisionNotFoundError,
    )

    if isinstance(exc, FetchError):
        return exc
    if isinstance(exc, DiskFull) or (isinstance(exc, OSError) and exc.errno == errno.ENOSPC):
        return FetchError("disk_full", f"{where}: {exc}")
    if isinstance(exc, GatedRepoError):
        return FetchError("auth", f"{where}: access denied (a gated repo: accept its terms and give the replicas "
                                  f"HF_TOKEN of an account that did)")
    if isinstance(exc, (LocalEntryNotFoundError, OfflineModeIsEnabled)):
        return FetchError("offline", f"{where}: not in this node's cache and the Hub cannot be reached "
                                     f"(HF_HUB_OFFLINE, or no network): {_first_line(exc)}")
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if status in (401, 403):
        return FetchError("auth", f"{where}: access denied by the Hub (HTTP {status}): set HF_TOKEN for the replicas "
                                  f"to a token that can read the repo")
    if isinstance(exc, (RepositoryNotFoundError, RevisionNotFoundError, EntryNotFoundError)) or status == 404:
        return FetchError("not_found", f"{where}: not found on the Hub ({_first_line(exc)}); a private repo also "
                                       f"reads as missing without HF_TOKEN")
    if isinstance(exc, (HfHubHTTPError, OSError, ConnectionError)):
        return FetchError("network", f"{where}: {_first_line(exc)}")
    return FetchError("network", f"{where}: {type(exc).__name__}: {_first_line(exc)}")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


# --- buckets and URLs (fsspec) ---------------------------------------------------------------------------


def open_url_fs(url: str) -> tuple[Any, str]:
    """(fsspec file system, path) of a URL. Credentials and endpoints come from each library's own
    environment (AWS_* incl. AWS_ENDPOINT_URL for s3fs, GOOGLE_APPLICATION_CREDENTIALS for gcsfs), or from
    the URL's userinfo (percent-encoded): KEY:SECRET for s3://, Basic auth for http(s)://. Those become the
    file system's options and leave the path, which fsspec and aiohttp write into their logs and errors."""
    import fsspec

    options: dict[str, Any] = {}
    given = userinfo(url)
    if given is not None:
        if url.lower().startswith("s3://"):
            options = {"key": given[0], "secret": given[1]}
        elif url.lower().startswith(("http://", "https://")):
            # aiohttp drops the header on a redirect to another origin (a CDN), as it does `auth=`
            basic = base64.b64encode(f"{given[0]}:{given[1]}".encode()).decode()
            options = {"client_kwargs": {"headers": {"Authorization": f"Basic {basic}"}}}
        url = without_userinfo(url)
    try:
        return fsspec.core.url_to_fs(url, **options)
    except ImportError as exc:
        raise FetchError("not_found", f"{url}: no file system for it is installed ({exc}); install "
                                      f"llamaray[s3] or llamaray[gcs]") from None


def _fetch_url(source: ModelSource, root: Path, progress: Progress, sha256: str | None) -> Path:
    folder_url, name = source.url.rsplit("/", 1)
    folder = url_dir(root, source.url)
    targets = [(f"{folder_url}/{part}", folder / part) for part in split_parts(name)]
    try:
        missing = [(open_url_fs(url), dest) for url, dest in targets if not dest.is_file()]
        if missing:
            infos = [fs.info(path) for (fs, path), _ in missing]
            sizes = [_size(info) for info in infos]
            check_free_space(folder, sum(s or 0 for s in sizes) - sum(_partial(dest) for _, dest in missing))
            progress.begin(sum(s or 0 for s in sizes))
            for ((fs, path), dest), info in zip(missing, infos):
                # The configured sha256 is the first part's (or the whole file's)
                _copy(fs, path, dest, info, progress, sha256 if dest == targets[0][1] else None, root)
        if sha256:
            verify_sha256(targets[0][1], sha256, root)  # a file already here: remembered, or hashed once
    except Exception as exc:  # noqa: BLE001 - every failure becomes a FetchError with its reason
        raise url_error(exc, source.url) from exc
    return targets[0][1]


def _size(info: dict[str, Any]) -> int | None:
    """The object's declared size (Content-Length, the object's size), None when the source gives none."""
    size = info.get("size")
    return int(size) if size else None


def _identity(info: dict[str, Any]) -> dict[str, Any]:
    """What tells this object from another at the same URL: its size and what the store says of its
    version (ETag, generation, modification time)."""
    keys = ("ETag", "etag", "md5Hash", "generation", "LastModified", "Last-Modified", "mtime", "updated")
    return {"size": _size(info), **{k: str(info[k]) for k in keys if info.get(k) is not None}}


def _partial(dest: Path) -> int:
    part = dest.with_name(dest.name + ".part")
    return part.stat().st_size if part.is_file() else 0


def _copy(fs: Any, path: str, dest: Path, info: dict[str, Any], progress: Progress, sha256: str | None,
          root: Path) -> None:
    """Copy into <dest>.part and rename it into place when whole: its size the source's declared size and,
    given a sha256, matching it. A part that an earlier try left is resumed only when its record
    (<dest>.part.id, written before its first byte) names this very object and the object has a known size;
    any other (junk, a changed object, no record) is discarded first. A resumed part that still fails a
    check is discarded and the file fetched again from zero, once: only a fresh download's checksum
    mismatch is lasting."""
    part = dest.with_name(dest.name + ".part")
    record = dest.with_name(dest.name + ".part.id")
    identity, size = _identity(info), _size(info)
    offset = _partial(dest)
    if offset and (size is None or offset > size or not _same_object(record, identity)):
        log.warning("%s: discarding a partial download that is not this object's (%d bytes)", dest.name, offset)
        _discard(part, record)
        offset = 0
    if offset:
        before = progress.done
        progress.advance(offset)
        try:
            _download(fs, path, part, offset, progress)
            _check(part, size, sha256, root)
        except FetchError as exc:
            if part.is_file() and size is not None and _partial(dest) < size:
                raise  # cut short again: resumed by the next try
            log.warning("%s: the resumed download failed its check (%s); fetching it again from zero", dest.name, exc)
            progress.advance(before - progress.done)
            _discard(part, record)
        else:
            _install(part, record, dest)
            return
    record.write_text(json.dumps(identity, sort_keys=True))
    with open(part, "wb"):
        pass
    try:
        _download(fs, path, part, 0, progress)
        _check(part, size, sha256, root)
    except BaseException:
        if not part.is_file():  # discarded by the check: its record goes with it
            record.unlink(missing_ok=True)
        raise
    _install(part, record, dest)


def _same_object(record: Path, identity: dict[str, Any]) -> bool:
    try:
        return json.loads(record.read_text()) == identity
    except (OSError, ValueError):
        return False


def _discard(part: Path, record: Path) -> None:
    part.unlink(missing_ok=True)
    record.unlink(missing_ok=True)


def _install(part: Path, record: Path, dest: Path) -> None:
    os.replace(part, dest)
    record.unlink(missing_ok=True)


def _download(fs: Any, path: str, part: Path, offset: int, progress: Progress) -> None:
    with fs.open(path, "rb", block_size=CHUNK) as src, open(part, "ab") as out:
        if offset:
            src.seek(offset)
        while chunk := src.read(CHUNK):
            out.write(chunk)
            progress.advance(len(chunk))
        out.flush()
        os.fsync(out.fileno())


def _check(part: Path, size: int | None, sha256: str | None, root: Path) -> None:
    """FetchError unless the part is whole: "network" for a size other than the declared one (a shorter
    part is kept, for the next try to resume; a longer one is not this object's), "checksum" (the part
    removed) for a sha256 mismatch."""
    got = part.stat().st_size
    if size is not None and got != size:
        if got > size:
            part.unlink(missing_ok=True)
        raise FetchError("network", f"{part.name.removesuffix('.part')}: got {got} bytes, the source declares {size}")
    if sha256:
        verify_sha256(part, sha256, root, remove_bad=True)


def url_error(exc: Exception, url: str) -> FetchError:
    if isinstance(exc, FetchError):
        return exc
    if isinstance(exc, DiskFull) or (isinstance(exc, OSError) and exc.errno == errno.ENOSPC):
        return FetchError("disk_full", f"{url}: {exc}")
    if isinstance(exc, FileNotFoundError):
        cause = exc.__cause__
        if cause is not None and not isinstance(cause, FileNotFoundError):
            # fsspec's HTTP file system says "not found" for anything that failed (refused connection,
            # 403): the cause tells which, so no network is not taken for a lasting failure
            return url_error(cause, url)
        return FetchError("not_found", f"{url}: not found")
    if isinstance(exc, PermissionError) or type(exc).__name__ in ("NoCredentialsError", "PartialCredentialsError"):
        return FetchError("auth", f"{url}: access denied ({_first_line(exc)}): give the replicas credentials that "
                                  f"can read it (AWS_* for s3://, GOOGLE_APPLICATION_CREDENTIALS for gs://)")
    status = getattr(exc, "status", None) or getattr(exc, "code", None)
    if status in (401, 403):
        return FetchError("auth", f"{url}: access denied (HTTP {status})")
    if status == 404:
        return FetchError("not_found", f"{url}: not found (HTTP 404)")
    return FetchError("network", f"{url}: {type(exc).__name__}: {_first_line(exc)}")
