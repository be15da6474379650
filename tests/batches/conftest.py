"""What the batch tests share: a store in a temporary folder, model specs that need no GGUF, and batch files."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.batches.store import BatchStore
from app.config.app_args import BatchConfig
from app.config.spec import ModelSpec

CHAT, EMBED = "chat-m", "embed-m"
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def spec(model_id: str, kind: str = "chat", n_seq_max: int = 4) -> ModelSpec:
    return ModelSpec(id=model_id, path="/nonexistent.gguf", n_ctx=512, n_seq_max=n_seq_max, n_batch=64, n_threads=1,
                     n_threads_batch=1, n_gpu_layers=0, kv_unified=True, cpu_extra_buffers="auto",
                     startup_self_check=False, chat_template=TEMPLATE, bos_token="", eos_token="<|im_end|>",
                     reasoning_parser="none", tool_parser="auto", default_max_tokens=None, max_tokens_limit=100,
                     stream_interval_ms=0, tool_continuation_rounds=0, tool_continuation_tokens=0,
                     owned_by="me", n_vocab=1000, kind=kind)


SPECS = [spec(CHAT), spec(EMBED, "embedding")]
MODELS = {s.id: s for s in SPECS}


def chat_line(custom_id: str, content: str = "hi", model: str = CHAT, system: str | None = None,
              **body: Any) -> dict[str, Any]:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "messages": messages, "max_tokens": 4, **body}}


def jsonl(lines: list[Any]) -> bytes:
    return b"".join((line if isinstance(line, bytes) else json.dumps(line).encode()) + b"\n" for line in lines)


@pytest.fixture
def store(tmp_path) -> BatchStore:
    return BatchStore(str(tmp_path / "batches"))


@pytest.fixture
def config() -> BatchConfig:
    return BatchConfig(chunk_lines=3, chunk_s=0.05, max_attempts=3)
