"""Key policies: who may call, and how much. The keys file names each tenant's key by its SHA-256 (the
file is safe to show, and a leaked copy lets no one in) with its limits:

    keys:
      - name: team-a                      # the tenant's label in usage, metrics and logs
        key_sha256: 9f86d08...            # `llamaray hash-key` prints it
        requests_per_minute: 600
        tokens_per_minute: 200000         # prompt + completion, counted as usage is
        max_concurrent: 16
        token_budget: {tokens: 5000000, per: day}    # or per: month (UTC calendar)
        models: [smollm2, "smollm2:support"]          # exact ids; `smollm2:*` is smollm2 and all its adapters
        priority: normal                  # high, normal or low: its weight in the fair share
        admin: false                      # true: may call the admin routes

Every field but `name` and `key_sha256` is optional (absent: no limit). Errors name the line they are on,
so a file edited by hand on a live cluster is fixed where it is wrong."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

# A key over its share waits behind keys under it in proportion to these (app/tenants/fair_share.py).
PRIORITY_WEIGHTS: dict[str, float] = {"high": 4.0, "normal": 2.0, "low": 1.0}

_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


def key_hash(key: str | bytes) -> str:
    """The SHA-256 of a key, hex: what the keys file stores. Keys are random secrets, so a fast hash is
    enough (no password stretching needed: there is nothing to guess)."""
    return hashlib.sha256(key.encode() if isinstance(key, str) else key).hexdigest()


class TokenBudget(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    tokens: int = Field(ge=1, le=10**15)
    per: Literal["day", "month"]


class KeyPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True, frozen=True)

    name: str = Field(pattern=_NAME)
    key_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    requests_per_minute: int | None = Field(None, ge=1, le=10**9)
    tokens_per_minute: int | None = Field(None, ge=1, le=10**12)
    max_concurrent: int | None = Field(None, ge=1, le=10**6)
    token_budget: TokenBudget | None = None
    models: tuple[str, ...] | None = None
    priority: Literal["high", "normal", "low"] = "normal"
    # May call the admin routes (load, unload and pin pooled models; every key's usage). Without keys the
    # server has no admins to tell apart: its admin routes answer the local user (behind the browser guard).
    admin: bool = False

    @field_validator("models", mode="before")
    @classmethod
    def _models_list(cls, value: Any) -> Any:
        if isinstance(value, list):  # YAML gives lists; strict mode wants the tuple the model holds
            if not all(isinstance(m, str) and m for m in value):
                raise ValueError("models must be a list of model ids")
            return tuple(value)
        return value

    @property
    def limited(self) -> bool:
        """Whether anything about this key needs counting (an unlimited key costs nothing per request)."""
        return any(v is not None for v in (self.requests_per_minute, self.tokens_per_minute, self.max_concurrent,
                                           self.token_budget))

    @property
    def weight(self) -> float:
        return PRIORITY_WEIGHTS[self.priority]


class _KeysFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    keys: list[KeyPolicy]

    @model_validator(mode="after")
    def _unique(self) -> "_KeysFile":
        for field in ("name", "key_sha256"):
            seen: set[str] = set()
            for index, policy in enumerate(self.keys):
                value = getattr(policy, field)
                if value in seen:
                    raise _Duplicate(index, field, value)
                seen.add(value)
        return self


class _Duplicate(ValueError):
    def __init__(self, index: int, field: str, value: str) -> None:
        shown = value if field == "name" else value[:12] + "..."
        super().__init__(f"duplicate {field} {shown!r}")
        self.loc = ("keys", index, field)


class KeysFileError(ValueError):
    """A keys file that cannot be used, with where: `path:line: field: what is wrong`."""


@dataclass(frozen=True)
class KeyPolicies:
    """The policies in force, by key hash."""

    by_hash: dict[str, KeyPolicy]

    @classmethod
    def of(cls, policies: list[KeyPolicy]) -> "KeyPolicies":
        return cls({p.key_sha256: p for p in policies})

    def find(self, key: bytes) -> KeyPolicy | None:
        # A dict lookup by digest: timing can reveal at most something about the digest, which tells an
        # attacker nothing about any key (unlike comparing keys themselves byte by byte).
        return self.by_hash.get(key_hash(key))

    def __len__(self) -> int:
        return len(self.by_hash)


def is_policy_file(text: str) -> bool:
    """Whether a keys file is the policy format (a `keys:` mapping) rather than the plain one (a key per line)."""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            return re.match(r"^keys\s*:", stripped) is not None
    return False


def parse_key_policies(text: str, path: str = "<keys file>") -> list[KeyPolicy]:
    """The policies of a keys file's text; a KeysFileError naming the line of the first problem."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise KeysFileError(f"{path}{line}: not valid YAML: {getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(data, dict):
        raise KeysFileError(f"{path}:1: a keys file is a mapping with a `keys:` list")
    try:
        return _KeysFile.model_validate(data).keys
    except ValidationError as exc:
        error = exc.errors()[0]
        loc, message = tuple(error["loc"]), error["msg"]
        if error["type"] == "extra_forbidden":
            message = f"unknown field `{loc[-1]}`"
        elif error["type"] == "missing":
            message = f"missing field `{loc[-1]}`"
        cause = (error.get("ctx") or {}).get("error")
        if isinstance(cause, _Duplicate):
            loc, message = cause.loc, str(cause)
        where = ".".join(str(part) for part in loc)
        raise KeysFileError(f"{path}:{_line_of(root, loc)}: {where}: {message}") from None


def _line_of(node: Any, loc: tuple) -> int:
    """The 1-based line of the YAML node at `loc` (the deepest one that exists: a missing field is reported
    on the entry that lacks it)."""
    line = node.start_mark.line + 1 if node is not None else 1
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if k.value == part), None)
            if match is None:
                break
            key, node = match
            # A field's problem is on the field's line (a nested mapping starts on the next one).
            line = key.start_mark.line + 1
            continue
        if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
            continue
        break
    return line
