"""What the builder learns about a remote model without fetching it: the Hub file a quantization tag
names and the commit to pin every node to, and the GGUF header (metadata, vocabulary) by range reads:
the key/value section only, within a bound, never the tensors."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from .gguf import read_metadata
from .cached import cached_file, cached_pin
from .fetch import FetchError, hub_error, url_error, hub_endpoint, open_url_fs
from .quant import pick_quant
from .source import ModelSource

log = logging.getLogger("llamaray.model_sources")

# The largest header read: big vocabularies (tokens, scores, types, merges) run to tens of MiB.
MAX_HEADER_BYTES = 64 << 20
# Range reads of this size: few round trips for a typical header, little waste past its end.
HEADER_BLOCK = 2 << 20


def pin(source: ModelSource, root: Path | None = None) -> ModelSource:
    """A Hub source with its file chosen (by quantization tag) and its revision resolved to a commit,
    so that every node fetches the same bytes; other sources as they are. Without the Hub (offline, no
    network), the model cache under `root` (when given) pins it to a snapshot it holds. FetchError (or
    QuantError) when the Hub says no."""
    if source.kind != "hf":
        return source
    from huggingface_hub import HfApi

    where = f"{source.repo}" + (f"@{source.revision}" if source.revision else "")
    try:
        info = HfApi(endpoint=hub_endpoint()).model_info(source.repo, revision=source.revision)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a FetchError with its reason
        error = hub_error(exc, where)
        held = cached_pin(source, root) if root is not None and error.reason in ("offline", "network") else None
        if held is None:
            raise error from exc
        log.warning("%s: the Hub cannot be reached (%s); pinned to commit %s, which this machine's model cache "
                    "holds", where, error, held.revision)
        return held
    files = [s.rfilename for s in info.siblings or []]
    filename = source.filename
    if filename is None:
        filename = pick_quant(source.repo, files, source.quant or "")
    elif filename not in files:
        raise FetchError("not_found", f"{where} has no file {filename!r}")
    return source.pinned(filename, info.sha)


def read_header(source: ModelSource, keep_arrays: tuple[str, ...] = (),
                max_bytes: int = MAX_HEADER_BYTES, root: Path | None = None) -> dict[str, Any]:
    """The GGUF metadata of a remote (pinned) source, read in ranges up to `max_bytes`; from the model
    cache under `root` (when given) if it holds the file: no network needed, as offline it has none."""
    local = cached_file(source, root) if root is not None else None
    if local is not None:
        try:
            with open(local, "rb") as f:
                return read_metadata(f, keep_arrays, max_bytes)
        except OSError as exc:
            raise FetchError("network", f"{source.canonical()}: cannot read the cached {local}: {exc}") from None
    if source.kind == "hf":
        from huggingface_hub import HfFileSystem

        where = source.canonical()
        try:
            fs = HfFileSystem(endpoint=hub_endpoint(), skip_instance_cache=True)
            with fs.open(f"{source.repo}/{source.filename}", "rb", revision=source.revision,
                         block_size=HEADER_BLOCK) as f:
                return read_metadata(f, keep_arrays, max_bytes)
        except (FetchError, ValueError):
            raise
        except Exception as exc:  # noqa: BLE001
            raise hub_error(exc, where) from exc
    try:
        fs, path = open_url_fs(source.url)
        with fs.open(path, "rb", block_size=HEADER_BLOCK) as f:
            return read_metadata(f, keep_arrays, max_bytes)
    except (FetchError, ValueError):
        raise
    except Exception as exc:  # noqa: BLE001
        raise url_error(exc, source.url) from exc
