"""The `pools:` of the app's args checked against its models, and each pool's catalogue read into model
entries: a model names a pool that exists, a pinned model is one of its pool's, the pinned fit in
`max_models`. Raised as ValueError inside AppArgs' validation, so parse_args reports them as config lines.

A catalogue is a directory laid out as llama-server's router mode reads `--models-dir`: each `<id>.gguf` in it
is a model (a split model, `<id>-00001-of-0000N.gguf` and its parts, is one); a projector beside it
(`mmproj-<id>.gguf`) is its `mmproj_path`; and a subdirectory holding one model's GGUF (whole or split) is a
model called by the subdirectory's name, with the `mmproj*.gguf` in it as its projector."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from ..model_sources.source import SourceError, parse_source
from ..model_sources.splits import is_later_part, split_parts
from .paths import resolve_path
from .schema import MODEL_ID_RE, ModelConfig, PoolConfig

_SPLIT_SUFFIX = re.compile(r"^(?P<stem>.*)-\d{5}-of-\d{5}\.gguf$", re.I)  # as model_sources.splits names parts


@dataclass(frozen=True)
class CatalogueEntry:
    """A model a catalogue directory holds: its id, its GGUF (a split model's first part) and its projector."""

    id: str
    path: Path
    projector: Path | None = None


def expand_pools(models: list[ModelConfig], pools: list[PoolConfig]) -> list[ModelConfig]:
    """`models` with every pool's catalogue models after them; a ValueError names the first problem."""
    names = [p.name for p in pools]
    for name in {n for n in names if names.count(n) > 1}:
        raise ValueError(f"pool {name!r} is configured twice")
    by_name = {p.name: p for p in pools}
    for m in models:
        if m.pool is not None and m.pool not in by_name:
            known = ", ".join(repr(n) for n in names) or "none"
            raise ValueError(f"model {m.id!r} names pool {m.pool!r}, which is not configured (pools: {known})")
    out = list(models)
    explicit = {m.id: m for m in models}
    found: dict[str, str] = {}  # catalogue model id -> the pool whose catalogue holds it
    for pool in pools:
        for cfg in catalogue_models(pool):
            if cfg.id in found:
                raise ValueError(f"model {cfg.id!r} is in the catalogues of pools {found[cfg.id]!r} and "
                                 f"{pool.name!r}: a model id names one model; rename one of the files")
            found[cfg.id] = pool.name
            entry = explicit.get(cfg.id)
            if entry is None:
                out.append(cfg)
            elif entry.pool != pool.name:  # an entry in `models` of the same pool configures it instead
                where = f"pool {entry.pool!r}" if entry.pool else "a deployment of its own (no `pool`)"
                raise ValueError(f"model {cfg.id!r} is both an entry of `models` (in {where}) and a GGUF of pool "
                                 f"{pool.name!r}'s catalogue ({cfg.model_path}): give the entry `pool: "
                                 f"{pool.name}` to configure the catalogue's model, or rename one")
    for pool in pools:
        members = [m.id for m in out if m.pool == pool.name]
        if not members:
            raise ValueError(f"pool {pool.name!r} serves no model: give models `pool: {pool.name}`, a `catalogue` "
                             f"or a `hub` list")
        stray = [p for p in pool.pinned if p not in members]
        if stray:
            raise ValueError(f"pool {pool.name!r} pins {stray[0]!r}, which is not one of its models "
                             f"({', '.join(members)})")
        if len(set(pool.pinned)) > pool.max_models:
            raise ValueError(f"pool {pool.name!r} pins {len(set(pool.pinned))} models but holds at most "
                             f"max_models {pool.max_models}")
        if len(set(pool.pinned)) == pool.max_models and len(members) > pool.max_models:
            raise ValueError(f"pool {pool.name!r}: its {pool.max_models} pinned models fill max_models, so its other "
                             f"models could never load: raise max_models or pin fewer")
    return out


def catalogue_models(pool: PoolConfig) -> list[ModelConfig]:
    """A model entry per model of the pool's catalogue directory and of its hub list (pool.model_defaults
    under each)."""
    found = catalogue_entries(pool) if pool.catalogue is not None else []
    entries = [(f.id, {"model_path": str(f.path)} | ({"mmproj_path": str(f.projector)} if f.projector else {}))
               for f in found]
    entries += [(hub_model_id(pool, source), {"model_path": source}) for source in pool.hub]
    out = []
    for model_id, paths in entries:
        entry = {**pool.model_defaults, "id": model_id, "pool": pool.name, "model_path": paths["model_path"]}
        if "mmproj_path" in paths and "mmproj_path" not in pool.model_defaults:
            entry["mmproj_path"] = paths["mmproj_path"]
        try:
            out.append(ModelConfig.model_validate(entry))
        except ValidationError as exc:
            err = exc.errors(include_url=False)[0]
            where = ".".join(str(p) for p in err["loc"]) or "entry"
            raise ValueError(f"pool {pool.name!r}: catalogue model {model_id!r}: `{where}`: "
                             f"{err['msg'].removeprefix('Value error, ')}") from None
    return out


def hub_model_id(pool: PoolConfig, source: str) -> str:
    """The id of a hub-list model: its source without the revision (`org/repo:quant`, or `org/repo/file` for
    an hf:// file); a ValueError for what is not a Hub GGUF."""
    try:
        parsed = parse_source(source)
    except SourceError as exc:
        raise ValueError(f"pool {pool.name!r}: hub entry {source!r}: {exc}") from None
    if parsed.kind != "hf":
        raise ValueError(f"pool {pool.name!r}: hub entry {source!r} is not a Hugging Face Hub GGUF: write "
                         f"<org>/<repo>:<quant> or hf://<org>/<repo>/<file.gguf> (other sources go in `models`)")
    if parsed.filename is not None:
        return f"{parsed.repo}/{parsed.filename.removesuffix('.gguf')}"
    return f"{parsed.repo}:{parsed.quant}"


def catalogue_entries(pool: PoolConfig) -> list[CatalogueEntry]:
    """The models of the pool's catalogue directory, by id; a ValueError names a layout it cannot read as
    models (none at all, a split with parts missing, a file name that is no model id, one id twice)."""
    assert pool.catalogue is not None
    folder = resolve_path(pool.catalogue)
    where = f"pool {pool.name!r}: catalogue {pool.catalogue!r}"
    if not folder.is_dir():
        raise ValueError(f"{where} is not a directory ({folder})")
    entries: list[CatalogueEntry] = []
    for path in sorted(folder.iterdir()):
        if path.is_dir():
            entry = _subdirectory_model(path, where)
            if entry is not None:
                entries.append(entry)
        elif _is_model_file(path):
            entries.append(CatalogueEntry(_model_id(path), _whole(path, where), _projector(path)))
    if not entries:
        raise ValueError(f"{where} holds no model: no *.gguf in {folder} (besides projectors, mmproj*), and no "
                         f"subdirectory with one")
    seen: dict[str, Path] = {}
    for entry in entries:
        if not MODEL_ID_RE.match(entry.id):
            raise ValueError(f"{where}: {entry.path.relative_to(folder)} would be model {entry.id!r}, which is not a "
                             f"valid model id (1-128 chars of letters, digits, '_', '.', ':', '/', '-', starting with "
                             f"a letter or digit): rename the file")
        if entry.id in seen:
            raise ValueError(f"{where}: {seen[entry.id].relative_to(folder)} and {entry.path.relative_to(folder)} "
                             f"would both be model {entry.id!r}: rename one")
        seen[entry.id] = entry.path
    return entries


def _is_projector(path: Path) -> bool:
    return "mmproj" in path.name.lower()


def _is_model_file(path: Path) -> bool:
    """A GGUF that is a model, counted once: not a projector, not a later part of a split."""
    name = path.name
    return (name.lower().endswith(".gguf") and path.is_file() and not _is_projector(path)
            and not is_later_part(name))


def _model_id(path: Path) -> str:
    """A file's model id: its name without `.gguf`, and without `-00001-of-0000N` for a split's first part."""
    split = _SPLIT_SUFFIX.match(path.name)
    return split["stem"] if split else path.name[:-len(".gguf")]


def _whole(path: Path, where: str) -> Path:
    """`path`, once every part of its split is beside it (llama.cpp loads the others by name)."""
    missing = [p for p in split_parts(path.name) if not (path.parent / p).is_file()]
    if missing:
        raise ValueError(f"{where}: split model {path.name} lacks {', '.join(missing)} beside it")
    return path


def _subdirectory_model(folder: Path, where: str) -> CatalogueEntry | None:
    """llama-server's layout: a folder per model, its GGUF (whole or split) and its projector (mmproj*.gguf)."""
    ggufs = [p for p in sorted(folder.iterdir()) if p.is_file() and p.name.lower().endswith(".gguf")]
    if not ggufs:
        return None  # not a model's folder (notes, other files): left alone
    models = [p for p in ggufs if _is_model_file(p)]
    projectors = [p for p in ggufs if _is_projector(p)]
    if len(models) != 1:
        found = ", ".join(p.name for p in models) or "none besides projectors"
        raise ValueError(f"{where}: subdirectory {folder.name}/ is one model, so it holds one model GGUF (whole or "
                         f"the first part of a split), but it has {found}")
    if len(projectors) > 1:
        raise ValueError(f"{where}: subdirectory {folder.name}/ has {len(projectors)} projectors "
                         f"({', '.join(p.name for p in projectors)}): keep one")
    return CatalogueEntry(folder.name, _whole(models[0], where), projectors[0] if projectors else None)


def _projector(model: Path) -> Path | None:
    stem = _model_id(model)
    for name in (f"mmproj-{stem}.gguf", f"{stem}.mmproj.gguf", f"{stem}-mmproj.gguf"):
        if (model.parent / name).is_file():
            return model.parent / name
    return None
