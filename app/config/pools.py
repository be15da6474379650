"""The `pools:` of the app's args checked against its models, and each pool's catalogue read into model
entries: a model names a pool that exists, a pinned model is one of its pool's, the pinned fit in
`max_models`. Raised as ValueError inside AppArgs' validation, so parse_args reports them as config lines."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from .settings import ModelConfig, PoolConfig, resolve_path


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
    ids = {m.id for m in models}
    for pool in pools:
        for cfg in catalogue_models(pool):
            if cfg.id not in ids:  # an entry in `models` with the same id configures it instead
                out.append(cfg)
                ids.add(cfg.id)
    for pool in pools:
        members = [m.id for m in out if m.pool == pool.name]
        if not members:
            raise ValueError(f"pool {pool.name!r} serves no model: give models `pool: {pool.name}` or a `catalogue`")
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
    """A model entry per *.gguf of the pool's catalogue directory (projectors, mmproj*, beside their model)."""
    if pool.catalogue is None:
        return []
    folder = resolve_path(pool.catalogue)
    if not folder.is_dir():
        raise ValueError(f"pool {pool.name!r}: catalogue {pool.catalogue!r} is not a directory ({folder})")
    out = []
    for path in sorted(folder.glob("*.gguf")):
        if "mmproj" in path.name.lower():
            continue
        model_id = path.name[:-len(".gguf")]
        entry = {**pool.model_defaults, "id": model_id, "model_path": str(path), "pool": pool.name}
        projector = _projector(path)
        if projector is not None and "mmproj_path" not in pool.model_defaults:
            entry["mmproj_path"] = str(projector)
        try:
            out.append(ModelConfig.model_validate(entry))
        except ValidationError as exc:
            err = exc.errors(include_url=False)[0]
            where = ".".join(str(p) for p in err["loc"]) or "entry"
            raise ValueError(f"pool {pool.name!r}: catalogue model {model_id!r}: `{where}`: "
                             f"{err['msg'].removeprefix('Value error, ')}") from None
    return out


def _projector(model: Path) -> Path | None:
    stem = model.name[:-len(".gguf")]
    for name in (f"mmproj-{stem}.gguf", f"{stem}.mmproj.gguf", f"{stem}-mmproj.gguf"):
        if (model.parent / name).is_file():
            return model.parent / name
    return None
