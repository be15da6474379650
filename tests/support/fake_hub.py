"""A local stand-in for the Hugging Face Hub, reached through HF_ENDPOINT: it serves local files under the
Hub's URL layout as huggingface_hub 2.4 talks to it, and counts what was asked.

    GET  /api/models/{repo}[/revision/{rev}]       model info: `sha` (the commit), `siblings`
    GET  /api/models/{repo}/tree/{rev}[/{path}]    the file list (HfFileSystem's `ls` / `info`)
    POST /api/models/{repo}/paths-info/{rev}       the same for named paths
    HEAD /{repo}/resolve/{rev}/{file}              X-Repo-Commit, ETag / X-Linked-Etag (the sha256, as
    GET  /{repo}/resolve/{rev}/{file}              for LFS files), X-Linked-Size; Range reads (206)

Unknown repos, revisions and files answer 404 with the Hub's X-Error-Code, so huggingface_hub raises its
own RepositoryNotFoundError / RevisionNotFoundError / RemoteEntryNotFoundError.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"
# Where the tests publish the bundled GGUF on the stand-in.
REPO, FILE = "test-org/smollm2-gguf", "SmolLM2-135M-Instruct.Q4_1.gguf"
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_API = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/(?P<what>revision|tree|paths-info)/(?P<rev>[^/]+)"
                  r"(?:/(?P<path>.*))?)?$")


class FakeHub:
    """`repos`: repo id -> {file name in the repo: local path}. `gets[(repo, file)]` counts GETs of a
    file's bytes that start at offset 0 with no end (whole downloads); `range_bytes` sums the bytes
    sent for ranged GETs (header reads)."""

    def __init__(self, repos: dict[str, dict[str, Path]]) -> None:
        self.repos = repos
        self.gets: Counter[tuple[str, str]] = Counter()
        self.range_bytes: Counter[tuple[str, str]] = Counter()
        self.authorizations: Counter[str] = Counter()  # the Authorization headers requests came with
        self._sha: dict[Path, str] = {}
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeHub":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def sha256(self, path: Path) -> str:
        with self._lock:
            if path not in self._sha:
                digest = hashlib.sha256()
                with open(path, "rb") as f:
                    while chunk := f.read(1 << 20):
                        digest.update(chunk)
                self._sha[path] = digest.hexdigest()
            return self._sha[path]

    def entry(self, repo: str, name: str) -> dict:
        path = self.repos[repo][name]
        size = path.stat().st_size
        oid = self.sha256(path)
        return {"type": "file", "oid": hashlib.sha1(oid.encode()).hexdigest(), "size": size, "path": name,
                "lfs": {"oid": oid, "size": size, "pointerSize": 134}}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _json(self, body: object, status: int = 200) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _missing(self, code: str) -> None:
                data = json.dumps({"error": code}).encode()
                self.send_response(404)
                self.send_header("X-Error-Code", code)
                self.send_header("X-Error-Message", code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def _repo(self, repo: str, rev: str | None) -> dict[str, Path] | None:
                if repo not in hub.repos:
                    self._missing("RepoNotFound")
                    return None
                if rev not in (None, "main", COMMIT):
                    self._missing("RevisionNotFound")
                    return None
                return hub.repos[repo]

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                self._serve()

            def do_HEAD(self) -> None:  # noqa: N802
                self._serve()

            def do_POST(self) -> None:  # noqa: N802
                self._serve()

            def _serve(self) -> None:
                if self.headers.get("Authorization"):
                    with hub._lock:
                        hub.authorizations[self.headers["Authorization"]] += 1
                parts = urlsplit(self.path)
                path = unquote(parts.path)
                m = _API.match(path)
                if m:
                    return self._api(m, parts.query)
                m = _RESOLVE.match(path)
                if m:
                    return self._resolve(m["repo"], m["rev"], m["file"])
                self._missing("RepoNotFound")

            def _api(self, m: re.Match, query: str) -> None:
                files = self._repo(m["repo"], unquote(m["rev"]) if m["rev"] else None)
                if files is None:
                    return
                what = m["what"]
                if what in (None, "revision"):
                    return self._json({"id": m["repo"], "modelId": m["repo"], "sha": COMMIT, "private": False,
                                       "siblings": [{"rfilename": name} for name in sorted(files)]})
                if what == "tree":
                    prefix = (m["path"] or "").strip("/")
                    names = [n for n in sorted(files) if not prefix or n.startswith(prefix + "/")]
                    recursive = parse_qs(query).get("recursive", ["false"])[0].lower() == "true"
                    entries, folders = [], set()
                    for name in names:
                        rest = name[len(prefix) + 1:] if prefix else name
                        if "/" in rest and not recursive:
                            folders.add((prefix + "/" if prefix else "") + rest.split("/", 1)[0])
                        else:
                            entries.append(hub.entry(m["repo"], name))
                    entries += [{"type": "directory", "oid": "0" * 40, "size": 0, "path": f} for f in sorted(folders)]
                    return self._json(entries)
                length = int(self.headers.get("Content-Length") or 0)
                form = parse_qs(self.rfile.read(length).decode()) if length else {}
                wanted = form.get("paths", [])
                return self._json([hub.entry(m["repo"], p) for p in wanted if p in files])

            def _resolve(self, repo: str, rev: str, name: str) -> None:
                files = self._repo(repo, rev)
                if files is None:
                    return
                if name not in files:
                    return self._missing("EntryNotFound")
                path = files[name]
                size = path.stat().st_size
                etag = f'"{hub.sha256(path)}"'
                start, end = 0, size - 1
                ranged = self.headers.get("Range")
                if ranged:
                    m = re.match(r"bytes=(\d+)-(\d*)$", ranged.strip())
                    if not m or int(m[1]) >= size:
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{size}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    start, end = int(m[1]), min(int(m[2]) if m[2] else size - 1, size - 1)
                self.send_response(206 if ranged else 200)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("ETag", etag)
                self.send_header("X-Linked-Etag", etag)
                self.send_header("X-Linked-Size", str(size))
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(end - start + 1))
                if ranged:
                    self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
                self.end_headers()
                if self.command == "HEAD":
                    return
                with hub._lock:
                    if start == 0 and (not ranged or end == size - 1):
                        hub.gets[(repo, name)] += 1
                    else:
                        hub.range_bytes[(repo, name)] += end - start + 1
                with open(path, "rb") as f:
                    f.seek(start)
                    left = end - start + 1
                    try:
                        while left > 0:
                            chunk = f.read(min(1 << 20, left))
                            self.wfile.write(chunk)
                            left -= len(chunk)
                    except (BrokenPipeError, ConnectionResetError):
                        pass

        return Handler
