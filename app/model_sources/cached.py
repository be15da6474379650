"""What a node's model cache already holds, for when the Hub or the URL cannot be reached (HF_HUB_OFFLINE,
no network): a Hub source pinned to a commit whose snapshot has the file, and the local file of a source.
A cluster restarted without network serves what it cached, and the builder reads the header from it."""

from __future__ import annotations

import logging
from pathlib import Path

from .cache import hub_cache, url_dir
from .quant import QuantError, pick_quant
from .source import ModelSource
from .splits import split_parts

log = logging.getLogger("llamaray.model_sources")

_COMMIT_LEN = 40


def _is_commit(revision: str | None) -> bool:
    return bool(revision) and len(revision) == _COMMIT_LEN and all(c in "0123456789abcdef" for c in revision)


def cached_pin(source: ModelSource, root: Path) -> ModelSource | None:
    """`source` (a Hub one) pinned to a commit whose snapshot in the cache under `root` holds its file, all
    parts of a split; for a quantization tag, the file the tag picks among the snapshot's files. None when
    the cache has none. A revision that is a commit must be that snapshot; a branch or tag is looked up in
    the cache's refs, else the newest snapshot with the file stands for it (llamaray downloads by commit,
    which writes no ref, so a cache it warmed has none)."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    if source.kind != "hf":
        return None
    try:
        repos = scan_cache_dir(hub_cache(root)).repos
    except CacheNotFound:
        return None
    repo = next((r for r in repos if r.repo_id == source.repo and r.repo_type == "model"), None)
    if repo is None:
        return None
    revisions = sorted(repo.revisions, key=lambda r: r.last_modified, reverse=True)
    wanted = source.revision
    if wanted:
        named = [r for r in revisions if r.commit_hash == wanted or wanted in r.refs]
        if named or _is_commit(wanted):
            revisions = named
    for revision in revisions:
        files = [f.file_path.relative_to(revision.snapshot_path).as_posix() for f in revision.files]
        name = source.filename
        if name is None:
            try:
                name = pick_quant(source.repo, files, source.quant or "")
            except QuantError:
                continue
        if all(part in files for part in split_parts(name)):
            return source.pinned(name, revision.commit_hash)
    return None


def cached_file(source: ModelSource, root: Path) -> Path | None:
    """The local file of a pinned Hub source, or of a URL source, when the cache under `root` holds it whole
    (for a split model, its first part with all the others beside it)."""
    if source.kind == "hf":
        from huggingface_hub import try_to_load_from_cache

        if not source.filename or not _is_commit(source.revision):
            return None
        found = [try_to_load_from_cache(source.repo, part, cache_dir=hub_cache(root), revision=source.revision)
                 for part in split_parts(source.filename)]
        return Path(found[0]) if all(isinstance(f, str) for f in found) else None
    if source.kind == "url":
        name = source.url.rsplit("/", 1)[1]
        folder = url_dir(root, source.url)
        if all((folder / part).is_file() for part in split_parts(name)):
            return folder / name
    return None
