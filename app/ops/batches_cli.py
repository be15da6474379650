"""`llamaray batches`: a server's batch jobs from the shell, over its HTTP API (what the `openai` SDK calls): list a
key's batches (an admin key's: everyone's) with their progress, show one, cancel one, and write its output and
error files."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx

KEY_ENV = "LLAMARAY_API_KEY"
DEFAULT_URL = "http://127.0.0.1:8000"


def add_parser(sub: Any) -> None:
    batches = sub.add_parser("batches", help="list, show, cancel a server's batch jobs and fetch their results")
    batches.add_argument("--url", default=os.environ.get("LLAMARAY_URL", DEFAULT_URL),
                         help=f"the server (default $LLAMARAY_URL, else {DEFAULT_URL})")
    batches.add_argument("--key", default=None, help=f"the API key (default ${KEY_ENV})")
    what = batches.add_subparsers(dest="action", required=True)
    listing = what.add_parser("list", help="the key's batches, newest first, with their progress")
    listing.add_argument("--limit", type=int, default=20)
    show = what.add_parser("show", help="one batch as JSON")
    show.add_argument("batch_id")
    cancel = what.add_parser("cancel", help="cancel a batch (its answered lines are kept)")
    cancel.add_argument("batch_id")
    results = what.add_parser("results", help="write a batch's output and error files")
    results.add_argument("batch_id")
    results.add_argument("-o", "--output-dir", type=Path, default=Path("."))


def run(ns: argparse.Namespace, client: httpx.Client | None = None) -> int:
    key = ns.key or os.environ.get(KEY_ENV)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    own = client is None
    client = client or httpx.Client(base_url=ns.url.rstrip("/"), timeout=60)
    try:
        return _run(ns, client, headers)
    except httpx.HTTPError as exc:
        print(f"llamaray batches: {ns.url}: {exc}", file=sys.stderr)
        return 2
    finally:
        if own:
            client.close()


def _run(ns: argparse.Namespace, client: httpx.Client, headers: dict[str, str]) -> int:
    if ns.action == "list":
        answer = client.get("/v1/batches", params={"limit": ns.limit}, headers=headers)
        if not _ok(answer):
            return 1
        print(f"{'id':44} {'status':11} {'endpoint':20} {'done':>7} {'failed':>7} {'total':>7}  created")
        for batch in answer.json()["data"]:
            counts = batch.get("request_counts") or {}
            created = time.strftime("%Y-%m-%d %H:%M", time.gmtime(batch["created_at"]))
            print(f"{batch['id']:44} {batch['status']:11} {batch['endpoint']:20} {counts.get('completed', 0):>7} "
                  f"{counts.get('failed', 0):>7} {counts.get('total', 0):>7}  {created}")
        return 0
    if ns.action in ("show", "cancel"):
        answer = (client.get(f"/v1/batches/{ns.batch_id}", headers=headers) if ns.action == "show" else
                  client.post(f"/v1/batches/{ns.batch_id}/cancel", headers=headers))
        if not _ok(answer):
            return 1
        print(json.dumps(answer.json(), indent=2))
        return 0
    answer = client.get(f"/v1/batches/{ns.batch_id}", headers=headers)
    if not _ok(answer):
        return 1
    batch = answer.json()
    written = 0
    for kind in ("output", "error"):
        file_id = batch.get(f"{kind}_file_id")
        if not file_id:
            continue
        path = ns.output_dir / f"{ns.batch_id}_{kind}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with client.stream("GET", f"/v1/files/{file_id}/content", headers=headers) as content:
            if content.status_code != 200:
                content.read()
                return 0 if _ok(content) else 1
            with path.open("wb") as out:
                for block in content.iter_bytes():
                    out.write(block)
        print(f"{path} ({kind} file)")
        written += 1
    if not written:
        print(f"batch {ns.batch_id} is {batch['status']}: no output or error file yet", file=sys.stderr)
        return 1
    return 0


def _ok(answer: httpx.Response) -> bool:
    if answer.status_code == 200:
        return True
    try:
        message = answer.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = answer.text[:200]
    print(f"llamaray batches: {answer.status_code}: {message}", file=sys.stderr)
    return False
