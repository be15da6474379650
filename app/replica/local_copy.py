"""In the replica: the spec with local files for everything the builder left remote (the model, its
projector, its LoRA adapters, its draft model), fetched into this node's cache, and the configured sha256 checked whatever the source."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..config.spec import ModelSpec
from ..model_sources.cache import cache_root
from ..model_sources.fetch import fetch, verify_sha256
from ..model_sources.progress import Progress
from ..model_sources.source import parse_source


def needs_fetch(spec: ModelSpec) -> bool:
    """Whether the replica has work before it can load the model (a download, a checksum)."""
    return bool(spec.source or spec.mmproj_source or spec.sha256 or any(a.source for a in spec.adapters)
                or (spec.speculative is not None and spec.speculative.draft_source))


def fetch_spec(spec: ModelSpec, progress: Progress) -> ModelSpec:
    """`spec` with `path` (and `mmproj_path`, each adapter's `path`) local; FetchError when a source cannot be had."""
    root = cache_root(spec.model_cache)
    path, mmproj = spec.path, spec.mmproj_path
    if spec.source:
        path = str(fetch(parse_source(spec.source), root, progress, sha256=spec.sha256))
    elif spec.sha256:
        progress.wait("checking its sha256")
        verify_sha256(Path(path), spec.sha256, root)
    if spec.mmproj_source:
        progress.label = spec.mmproj_source
        mmproj = str(fetch(parse_source(spec.mmproj_source), root, progress))
    adapters = []
    for adapter in spec.adapters:
        if adapter.source:
            progress.label = adapter.source
            adapter = replace(adapter, path=str(fetch(parse_source(adapter.source), root, progress)))
        adapters.append(adapter)
    speculative = spec.speculative
    if speculative is not None and speculative.draft_source:
        progress.label = speculative.draft_source
        speculative = replace(speculative, draft_path=str(fetch(parse_source(speculative.draft_source), root, progress)))
    return replace(spec, path=path, mmproj_path=mmproj, adapters=tuple(adapters), speculative=speculative)
