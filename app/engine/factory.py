"""The one place that picks a model's engine: from its entry's `engine` and `kind`.

`engine: synthetic` is a chat model's stand-in at configured rates (synthetic.py); otherwise llama.cpp runs
the GGUF, after the startup self-check when it is enabled (selfcheck.py: a native crash kills a child, not
the replica), as a pooling engine for an embedding model or a reranker (rank pooling) and a generating one
for a chat model. Engines load their modules here, on first use: llama.cpp only where a model needs it.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from ..config.spec import ModelSpec
from . import hardware
from .protocol import Engine
from .selfcheck import self_check_once

log = logging.getLogger("llamaray.engine")

POOLING_KINDS = ("embedding", "rerank")  # a reranker is a pooling model too (rank pooling)


def start_engine(spec: ModelSpec) -> Engine:
    """`spec`'s engine, started (its events go to the event loops' streams: stream.publish_to_loops);
    selfcheck.EngineUnavailable when llama.cpp cannot run the model in this process."""
    from .stream import publish_to_loops

    if spec.engine == "synthetic":
        from .synthetic import SyntheticEngine, SyntheticRates

        return SyntheticEngine(spec, SyntheticRates(*spec.synthetic), publish_to_loops).start()
    if spec.startup_self_check:
        report = self_check_once(spec)
        log.info("model %r passed the startup self-check (extra CPU buffers %s); %s", spec.id,
                 "on" if report.get("extra_buffers") else "off",
                 hardware.describe(report.get("system_info"), report.get("cpu_backend")))
        draft = spec.speculative.draft_path if spec.speculative is not None else ""
        if draft:  # the draft model is loaded in the replica too: a native crash on it must not take the replica
            self_check_once(replace(spec, id=f"{spec.id} (draft model)", path=draft, mmproj_path=None, adapters=()))
    if spec.kind in POOLING_KINDS:
        from .embedder import EmbeddingEngine

        return EmbeddingEngine(spec).start()
    from .engine import LlamaEngine

    return LlamaEngine(spec, publish=publish_to_loops).start()
