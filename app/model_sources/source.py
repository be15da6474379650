"""`model_path` as written in the config, parsed: which kind of source, and its parts.

    /models/x.gguf, ~/x.gguf, $DIR/x.gguf   a file on every node that runs the model
    pkg:<package>/<file>                    a GGUF shipped inside an installed Python package
    hf://<org>/<repo>/<file.gguf>[@<rev>]   one file of a Hugging Face Hub repository
    <org>/<repo>:<quant>[@<rev>]            llama-server's -hf form: the repo's GGUF of that quantization
    s3://..., gs://..., https://...         an object in a bucket or behind a URL (fsspec)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Literal

from .redact import redacted, without_userinfo

Kind = Literal["path", "pkg", "hf", "url"]

REMOTE_SCHEMES = ("s3", "gs", "https", "http")
_HF_URL = re.compile(r"^hf://(?P<repo>[\w.-]+/[\w.-]+)/(?P<file>[^@]+?\.gguf)(?:@(?P<rev>[\w./-]+))?$", re.I)
_HF_QUANT = re.compile(r"^(?P<repo>[\w.-]+/[\w.-]+):(?P<quant>[\w.-]+?)(?:@(?P<rev>[\w./-]+))?$")
_URL = re.compile(r"^(?P<scheme>[a-z0-9]+)://(?P<rest>.+)$", re.I)


class SourceError(ValueError):
    """`model_path` names no source we can fetch; the message says which forms exist (credentials hidden)."""

    def __init__(self, message: str) -> None:
        super().__init__(redacted(message))


@dataclass(frozen=True)
class ModelSource:
    """A parsed `model_path`. For `hf`: `repo`, `filename` (None until a quantization tag is resolved to
    a file) and `revision`; for `url`: `url`; for `path` and `pkg`: `text` itself."""

    kind: Kind
    text: str
    repo: str = ""
    filename: str | None = None
    revision: str | None = None
    quant: str | None = None
    url: str = ""

    @property
    def remote(self) -> bool:
        """Fetched by each node that runs it (the others are files already there)."""
        return self.kind in ("hf", "url")

    @property
    def scheme(self) -> str:
        return self.url.split("://", 1)[0].lower() if self.kind == "url" else self.kind

    def canonical(self) -> str:
        """The source in one unambiguous form: a resolved Hub file as hf://org/repo/file@rev."""
        if self.kind == "hf" and self.filename:
            return f"hf://{self.repo}/{self.filename}" + (f"@{self.revision}" if self.revision else "")
        return self.url if self.kind == "url" else self.text

    def shown(self) -> str:
        """The canonical form to show (logs, /health, errors): credentials in a URL hidden."""
        return redacted(self.canonical())

    def key(self) -> str:
        """What names the file, whatever the credentials: the node lock's and the cache folder's key."""
        return without_userinfo(self.canonical())

    def pinned(self, filename: str, revision: str | None) -> "ModelSource":
        """This Hub source with its file (a quantization tag resolved) and revision (a commit) fixed."""
        return replace(self, filename=filename, revision=revision or self.revision, quant=None,
                       text=f"hf://{self.repo}/{filename}" + (f"@{revision}" if revision else ""))


def parse_source(text: str) -> ModelSource:
    text = text.strip()
    if not text:
        raise SourceError("model_path is empty")
    if text.startswith("pkg:"):
        return ModelSource("pkg", text)
    m = _HF_URL.match(text)
    if m:
        return ModelSource("hf", text, repo=m["repo"], filename=m["file"], revision=m["rev"])
    if text.lower().startswith("hf://"):
        raise SourceError(f"model_path {text!r}: a Hub source is hf://<org>/<repo>/<file.gguf>[@<revision>]; "
                          f"or write <org>/<repo>:<quant> to pick the repo's GGUF by quantization")
    m = _URL.match(text)
    if m:
        if m["scheme"].lower() not in REMOTE_SCHEMES:
            raise SourceError(f"model_path {text!r}: unknown scheme {m['scheme']!r} (known: hf://, s3://, gs://, "
                              f"https://, a file path, pkg:<package>/<file>)")
        if not text.lower().endswith(".gguf"):
            raise SourceError(f"model_path {text!r}: a URL must name a .gguf file")
        if m["scheme"].lower() == "gs" and redacted(text) != text:
            raise SourceError(f"model_path {text!r}: a gs:// URL takes no credentials; give the replicas "
                              f"GOOGLE_APPLICATION_CREDENTIALS")
        return ModelSource("url", text, url=text)
    m = _HF_QUANT.match(text)
    if m and not text.startswith((".", "/", "~", "$")):
        return ModelSource("hf", text, repo=m["repo"], revision=m["rev"], quant=m["quant"])
    return ModelSource("path", text)
