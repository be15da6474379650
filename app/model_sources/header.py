"""What the builder learns about a remote model without fetching it: the Hub file a quantization tag
names and the commit to pin every node to, and the GGUF header (metadata, vocabulary) by range reads:
the key/value section only, within a bound, never the tensors."""

from __future__ import annotations

from typing import Any

from ..config.gguf import read_metadata
from .fetch import FetchError, hub_error, url_error, hub_endpoint, open_url_fs
from .quant import pick_quant
from .source import ModelSource

# The largest header read: big vocabularies (tokens, scores, types, merges) run to tens of MiB.
MAX_HEADER_BYTES = 64 << 20
# Range reads of this size: few round trips for a typical header, little waste past its end.
HEADER_BLOCK = 2 << 20


def pin(source: ModelSource) -> ModelSource:
    """A Hub source with its file chosen (by quantization tag) and its revision resolved to a commit,
    so that every node fetches the same bytes; other sources as they are. FetchError (or QuantError)
    when the Hub says no."""
    if source.kind != "hf":
        return source
    from huggingface_hub import HfApi

    where = f"{source.repo}" + (f"@{source.revision}" if source.revision else "")
    try:
        info = HfApi(endpoint=hub_endpoint()).model_info(source.repo, revision=source.revision)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a FetchError with its reason
        raise hub_error(exc, where) from exc
    files = [s.rfilename for s in info.siblings or []]
    filename = source.filename
    if filename is None:
        filename = pick_quant(source.repo, files, source.quant or "")
    elif filename not in files:
        raise FetchError("not_found", f"{where} has no file {filename!r}")
    return source.pinned(filename, info.sha)


def read_header(source: ModelSource, keep_arrays: tuple[str, ...] = (),
                max_bytes: int = MAX_HEADER_BYTES) -> dict[str, Any]:
    """The GGUF metadata of a remote (pinned) source, read in ranges up to `max_bytes`."""
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
