"""Thin, typed access to the llama.cpp C API through llama-cpp-python's ctypes bindings.

Only this module touches ctypes (vision.py, mtmd's, aside). Everything that allocates native memory has a matching free,
and owners (LlamaModelContext, SamplerChain) free it exactly once.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import llama_cpp as L
import numpy as np

from .errors import bad_input
from . import prompt_marks as content_marks
from .constraint import Constraint, GrammarRefused
from .params import SamplingParams
from .rerank_format import PairVocab

log = logging.getLogger("llamaray.llama")

_GGML_LOG_WARN, _GGML_LOG_ERROR = 3, 4  # enum ggml_log_level
_backend_lock = threading.Lock()
_backend_ready = False


_BUFFER_LINE = re.compile(r"\b([\w-]+) model buffer size\s*=\s*([\d.]+) MiB")
model_buffers: dict[str, float] = {}
"""Where the last loaded model's weights went (buffer type -> MiB), from llama.cpp's load log."""
_LOADED_BACKEND = re.compile(r"loaded (\S+) backend from (.+?)\s*$")
loaded_backends: dict[str, str] = {}
"""Backends ggml loaded as libraries at run time (name -> file), from its log: in a GGML_BACKEND_DL build
(tools/llama_build.py --portable) the CPU variant it chose for this CPU; empty where they are linked in."""
# The last error llama.cpp logged on this thread: a model load that fails says why only in its log (a file
# cut short, a tensor type unknown to this build), and a failed load is then reported with it.
_thread_errors = threading.local()
_LOAD_ERROR = re.compile(r"error loading model:\s*(.+)$")


@L.llama_log_callback
def _llama_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    msg = text.decode("utf-8", errors="replace").rstrip()
    found = _BUFFER_LINE.search(msg)
    if found:
        model_buffers[found.group(1)] = float(found.group(2))
    loaded = _LOADED_BACKEND.search(msg)
    if loaded:
        loaded_backends[loaded.group(1)] = loaded.group(2)
    # llama.cpp logs every tensor at load; keep only warnings and errors.
    if level in (_GGML_LOG_WARN, _GGML_LOG_ERROR) and msg:
        log.warning("llama.cpp: %s", msg)
        cause = _LOAD_ERROR.search(msg)
        if cause:
            _thread_errors.load = cause.group(1)


def load_error(path: str) -> str:
    """Why the last model load on this thread failed, as llama.cpp logged it (the file named by its name only:
    the message reaches clients), or a generic reason when it logged none."""
    cause = getattr(_thread_errors, "load", None) or "it logged no reason"
    return cause.replace(path, Path(path).name)


def _load_backend_libraries() -> None:
    """A GGML_BACKEND_DL build registers no backend until one is loaded, and llama_backend_init looks for
    them only next to the executable (python's bin/) and in the working directory; they are installed
    next to libllama (llama_cpp/lib, or LLAMA_CPP_LIB_PATH). ggml loads the best-scoring CPU variant
    for this CPU (and CUDA where a driver is). A build with its backends linked in has them
    registered already: then this does nothing."""
    lib, lib_dir = L.llama_cpp._lib, L.llama_cpp._base_path  # dlsym on libllama finds its libggml's symbols
    lib.ggml_backend_reg_count.restype = ctypes.c_size_t
    lib.ggml_backend_reg_count.argtypes = []
    if lib.ggml_backend_reg_count() > 0:
        return
    lib.ggml_backend_load_all_from_path.restype = None
    lib.ggml_backend_load_all_from_path.argtypes = [ctypes.c_char_p]
    lib.ggml_backend_load_all_from_path(str(lib_dir).encode())
    if lib.ggml_backend_reg_count() == 0:
        raise RuntimeError(f"llama.cpp found no backend library (libggml-cpu-*.so) to load in {lib_dir}")


def init_backend() -> None:
    global _backend_ready
    with _backend_lock:
        if not _backend_ready:
            L.llama_log_set(_llama_log, ctypes.c_void_p(0))  # first: the load logs which variant it chose
            _load_backend_libraries()
            L.llama_backend_init()
            _backend_ready = True


def cpu_backend() -> str:
    """Which CPU kernels run: the variant library ggml chose at run time ("haswell" for
    libggml-cpu-haswell.so), or "linked in" (a build for one CPU, tools/llama_build.py's default)."""
    init_backend()
    path = loaded_backends.get("CPU")
    if not path:
        return "linked in"
    name = path.rsplit("/", 1)[-1]
    match = re.match(r"libggml-cpu-(.+?)\.so", name)
    return match.group(1) if match else name
POOLING = {"mean": L.LLAMA_POOLING_TYPE_MEAN, "cls": L.LLAMA_POOLING_TYPE_CLS, "last": L.LLAMA_POOLING_TYPE_LAST,
           "rank": L.LLAMA_POOLING_TYPE_RANK}


# The KV cache types a model's entry may ask for (config: cache_type_k / cache_type_v), as ggml's type ids.
KV_TYPES = {"f16": L.GGML_TYPE_F16, "q8_0": L.GGML_TYPE_Q8_0, "q4_0": L.GGML_TYPE_Q4_0}


# A vocabulary's longest piece, by file version: a pool reloads a model it evicted (and serves one GGUF under several
# ids) without walking its vocabulary again (0.1-0.2 s of Python for 49k tokens: most of a small model's load).
_longest_pieces: dict[tuple[str, int, int], int | None] = {}


def _file_version(path: str) -> tuple[str, int, int]:
    st = os.stat(path)
    return os.path.realpath(path), st.st_size, st.st_mtime_ns


class ModelLoadError(RuntimeError):
    """llama.cpp refused the model file (corrupt, cut short, an unknown architecture, no memory for it)."""


class LlamaModelContext:
    """One loaded model and one context with `n_seq_max` sequences sharing a KV pool.

    `pooling` (a key of POOLING) makes it an embedding context: llama.cpp pools each sequence's token
    vectors into one (llama_get_embeddings_seq) instead of computing logits. Its micro-batch is the whole
    batch: non-causal attention (BERT) sees every token of a batch at once, and llama.cpp aborts the
    process on a batch larger than its micro-batch, so callers keep a batch within `n_batch`."""

    def __init__(self, path: str, *, n_ctx_per_seq: int, n_seq_max: int, n_batch: int, n_threads: int,
                 n_threads_batch: int, n_gpu_layers: int, kv_unified: bool, extra_buffers: bool = True,
                 pooling: str | None = None, type_k: str = "f16", type_v: str = "f16") -> None:
        init_backend()
        mparams = L.llama_model_default_params()
        mparams.n_gpu_layers = n_gpu_layers if n_gpu_layers >= 0 else 2**31 - 1
        # False keeps weights out of the extra CPU buffer types (repacked, AMX): see hardware.py.
        mparams.use_extra_bufts = extra_buffers
        model_buffers.clear()
        _thread_errors.load = None
        self.model = L.llama_model_load_from_file(path.encode(), mparams)
        if not self.model:
            raise ModelLoadError(f"llama.cpp could not load {Path(path).name}: {load_error(path)}")
        self.vocab = L.llama_model_get_vocab(self.model)
        cparams = L.llama_context_default_params()
        cparams.n_ctx = n_ctx_per_seq * n_seq_max
        cparams.n_batch = n_batch
        cparams.n_ubatch = min(n_batch, 512)
        cparams.n_seq_max = n_seq_max
        cparams.n_threads = n_threads
        cparams.n_threads_batch = n_threads_batch
        cparams.kv_unified = kv_unified
        cparams.no_perf = True
        # Quantized V needs flash attention, which llama.cpp turns on by itself where it can (flash_attn_type auto).
        cparams.type_k, cparams.type_v = KV_TYPES[type_k], KV_TYPES[type_v]
        self.kv_types = (type_k, type_v)
        if pooling is not None:
            cparams.embeddings = True
            cparams.pooling_type = POOLING[pooling]
            cparams.n_ubatch = n_batch
        self.ctx = L.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            L.llama_model_free(self.model)
            raise RuntimeError("llama.cpp could not create a context (out of memory for the KV cache?)")
        self.memory = L.llama_get_memory(self.ctx)
        self.n_ctx_per_seq = n_ctx_per_seq
        self.n_seq_max = n_seq_max
        self.n_batch = n_batch
        self.add_bos = bool(L.llama_vocab_get_add_bos(self.vocab))
        self.bos = L.llama_vocab_bos(self.vocab)
        self.n_vocab = int(L.llama_vocab_n_tokens(self.vocab))
        self.n_embd = int(L.llama_model_n_embd_out(self.model))
        # Floats per sequence that llama_get_embeddings_seq holds: a vector, or with rank pooling the
        # classifier's n_cls_out scores (reading n_embd floats there would run past llama.cpp's buffer).
        self.n_pooled = int(L.llama_model_n_cls_out(self.model)) if pooling == "rank" else self.n_embd
        self._piece_buf = ctypes.create_string_buffer(256)
        version = _file_version(path)
        if version not in _longest_pieces:
            _longest_pieces[version] = self._longest_piece()
        self.longest_piece = _longest_pieces[version]
        # Whether a sequence's KV can be cut back at any position (seq_rm of a tail): not in a recurrent or
        # hybrid model, whose state is one running summary of the sequence.
        self.can_cut_back = not (L.llama_model_is_recurrent(self.model) or L.llama_model_is_hybrid(self.model))

    def _longest_piece(self) -> int | None:
        """The most UTF-8 bytes of text one token stands for (control tokens written out), so a text of
        B bytes is at least B / this many tokens; None where that does not hold. BPE, SPM and RWKV
        vocabularies match text byte for byte (SPM's space marks become the space they stand for);
        WPM and UGM normalize it first (lowercase, accents), so one token may stand for more bytes."""
        if L.llama_vocab_type(self.vocab) not in (L.LLAMA_VOCAB_TYPE_SPM, L.LLAMA_VOCAB_TYPE_BPE,
                                                  L.LLAMA_VOCAB_TYPE_RWKV):
            return None
        buf = ctypes.create_string_buffer(256)
        longest = 1
        for token in range(self.n_vocab):
            n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, True)
            longest = max(longest, abs(n))  # negative: the piece's size, longer than the buffer
        return longest

    # -- tokens ----------------------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool | None = None, parse_special: bool = True) -> list[int]:
        """parse_special: control-token text (<|im_start|>) becomes control tokens, as a template needs."""
        add = self.add_bos if add_special is None else add_special
        data = text.encode("utf-8")
        n_max = len(data) + 8
        buf = (L.llama_token * n_max)()
        n = L.llama_tokenize(self.vocab, data, len(data), buf, n_max, add, parse_special)
        if n < 0:
            buf = (L.llama_token * -n)()
            n = L.llama_tokenize(self.vocab, data, len(data), buf, -n, add, parse_special)
        tokens = list(buf[:n])
        # A template that already renders BOS plus add_bos would double it.
        if self.add_bos and len(tokens) > 1 and tokens[0] == tokens[1] == self.bos:
            tokens = tokens[1:]
        return tokens

    def tokenize_prompt(self, prompt: str, add_special: bool = True) -> list[int]:
        """A rendered prompt: template text with special-token parsing, marked client text without.
        add_special: the tokens the model's tokenizer adds itself (BOS), as a generation has them."""
        add_bos = add_special and self.add_bos
        if content_marks.OPEN not in prompt and content_marks.CLOSE not in prompt:
            return self.tokenize(prompt, add_special=add_bos)
        tokens: list[int] = []
        for text, is_content in content_marks.split(prompt):
            tokens += self.tokenize(text, add_special=not tokens and add_bos, parse_special=not is_content)
        if not tokens and add_bos:
            tokens = [self.bos]
        return tokens

    def tokenize_segments(self, prompt: str, marker: str, add_special: bool = True) -> list[list[int]]:
        """`tokenize_prompt`'s tokens cut at each `marker` written by the template (outside client text):
        one list more than there are such markers. A `marker` a client typed stays text."""
        add_bos = add_special and self.add_bos
        runs = content_marks.split(prompt) if content_marks.OPEN in prompt or content_marks.CLOSE in prompt \
            else iter([(prompt, False)])
        segments: list[list[int]] = [[]]
        started = False
        for text, is_content in runs:
            for k, part in enumerate([text] if is_content else text.split(marker)):
                if k:
                    segments.append([])
                if part:
                    segments[-1] += self.tokenize(part, add_special=not started and add_bos,
                                                  parse_special=not is_content)
                    started = True
        if not started and add_bos:
            segments[0] = [self.bos]
        return segments

    def detokenize(self, tokens: list[int]) -> str:
        """The text of `tokens` (ids checked by the caller: llama.cpp aborts on one outside the vocabulary).
        Control tokens are written out (`<|im_end|>`); a piece of a UTF-8 character becomes U+FFFD.
        Thread-safe: reads the vocabulary only, into its own buffer."""
        arr = (L.llama_token * max(1, len(tokens)))(*tokens)
        size = 16 + 8 * len(tokens)
        for _ in range(2):
            buf = ctypes.create_string_buffer(size)
            n = L.llama_detokenize(self.vocab, arr, len(tokens), buf, size, False, True)
            if n >= 0:
                return buf.raw[:n].decode("utf-8", errors="replace")
            size = -n
        raise RuntimeError("llama_detokenize kept asking for a larger buffer")

    def pair_vocab(self) -> PairVocab:
        """The special tokens llama.cpp's rule puts around a (query, document) pair, and the model's `rerank`
        template (tokenizer.chat_template.rerank), if it has one."""
        raw = L.llama_model_chat_template(self.model, b"rerank")
        return PairVocab(bos=self.bos, eos=L.llama_vocab_eos(self.vocab), sep=L.llama_vocab_sep(self.vocab),
                         add_bos=self.add_bos, add_eos=bool(L.llama_vocab_get_add_eos(self.vocab)),
                         add_sep=bool(L.llama_vocab_get_add_sep(self.vocab)),
                         template=raw.decode("utf-8") if raw else None)

    def fim_tokens(self) -> dict[str, int]:
        """The vocabulary's fill-in-the-middle tokens by role, as llama.cpp reads them (the GGUF's
        tokenizer.ggml.fim_*_token_id, else tokens it recognises by their text); -1 where there is none."""
        v = self.vocab
        return {"pre": L.llama_vocab_fim_pre(v), "suf": L.llama_vocab_fim_suf(v), "mid": L.llama_vocab_fim_mid(v),
                "pad": L.llama_vocab_fim_pad(v), "rep": L.llama_vocab_fim_rep(v), "sep": L.llama_vocab_fim_sep(v)}

    def is_control(self, token: int) -> bool:
        return bool(L.llama_vocab_is_control(self.vocab, token))

    def piece(self, token: int) -> bytes:
        # special=True: control tokens a model emits on purpose ([TOOL_CALLS]) must reach parsers.
        n = L.llama_token_to_piece(self.vocab, token, self._piece_buf, len(self._piece_buf), 0, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = L.llama_token_to_piece(self.vocab, token, buf, -n, 0, True)
            return buf.raw[:n]
        return self._piece_buf.raw[:n]

    def is_eog(self, token: int) -> bool:
        return bool(L.llama_vocab_is_eog(self.vocab, token))

    # -- KV --------------------------------------------------------------------------------------
    def seq_rm(self, seq: int, p0: int, p1: int = -1) -> bool:
        return bool(L.llama_memory_seq_rm(self.memory, seq, p0, p1))

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        L.llama_memory_seq_cp(self.memory, src, dst, p0, p1)

    def seq_state(self, seq: int) -> tuple[Any, int]:
        """One sequence's KV, serialized by llama.cpp into host memory: (buffer, bytes used)."""
        size = L.llama_state_seq_get_size(self.ctx, seq)
        buf = (ctypes.c_uint8 * size)()
        return buf, int(L.llama_state_seq_get_data(self.ctx, buf, size, seq))

    @staticmethod
    def state_buffer(data: bytes) -> Any:
        """A stored state's bytes as the buffer `set_seq_state` takes (a copy: llama.cpp's API wants uint8*)."""
        return (ctypes.c_uint8 * len(data)).from_buffer_copy(data)

    def set_seq_state(self, seq: int, state: Any, size: int) -> bool:
        """Load a `seq_state` into `seq` (which should be empty); False if llama.cpp refused it."""
        return L.llama_state_seq_set_data(self.ctx, state, size, seq) > 0

    def close(self) -> None:
        if self.ctx:
            L.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            L.llama_model_free(self.model)
            self.model = None


class Batch:
    """A reusable llama_batch of up to `capacity` tokens, one sequence id each."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.raw = L.llama_batch_init(capacity, 0, 1)
        self.n = 0

    def clear(self) -> None:
        self.n = 0

    def add(self, token: int, pos: int, seq: int, logits: bool) -> int:
        i = self.n
        b = self.raw
        b.token[i] = token
        b.pos[i] = pos
        b.n_seq_id[i] = 1
        b.seq_id[i][0] = seq
        b.logits[i] = logits
        self.n += 1
        return i

    def free(self) -> None:
        if self.raw is not None:
            L.llama_batch_free(self.raw)
            self.raw = None


class EmbdBatch:
    """A reusable llama_batch of up to `capacity` embedding rows (an image's projected tokens) for one
    sequence. llama.cpp decodes a batch of tokens or of embeddings, never both: this is its own decode."""

    def __init__(self, capacity: int, n_embd: int) -> None:
        self.capacity = capacity
        self.n_embd = n_embd
        self.raw = L.llama_batch_init(capacity, n_embd, 1)
        self.n = 0

    def fill(self, rows: np.ndarray, pos0: int, seq: int) -> None:
        """`rows` (n, n_embd float32, n <= capacity) at positions pos0.. of `seq`; no logits kept."""
        n = len(rows)
        b = self.raw
        ctypes.memmove(b.embd, np.ascontiguousarray(rows, dtype=np.float32).ctypes.data, rows.size * 4)
        for i in range(n):
            b.pos[i] = pos0 + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq
            b.logits[i] = False
        self.n = n

    def free(self) -> None:
        if self.raw is not None:
            L.llama_batch_free(self.raw)
            self.raw = None


def decode_embd(llama: LlamaModelContext, batch: EmbdBatch, non_causal: bool) -> int:
    """Decode an embedding batch; `non_causal`: its rows attend to each other both ways (Gemma 3's
    images), llama.cpp's causal mask off for this decode only."""
    batch.raw.n_tokens = batch.n
    if non_causal:
        L.llama_set_causal_attn(llama.ctx, False)
    try:
        return int(L.llama_decode(llama.ctx, batch.raw))
    finally:
        if non_causal:
            L.llama_set_causal_attn(llama.ctx, True)


def decode(llama: LlamaModelContext, batch: Batch) -> int:
    batch.raw.n_tokens = batch.n
    return int(L.llama_decode(llama.ctx, batch.raw))


def embed_batch(llama: LlamaModelContext, batch: Batch, n_seqs: int) -> np.ndarray | None:
    """Decode `batch` on an embedding context (sequences 0..n_seqs-1, every token an output) and return each
    sequence's pooled output, a (n_seqs, n_pooled) float32 copy (a vector, or a reranker's scores); None if
    llama.cpp refused the batch.
    A decoder model's KV is cleared first: each batch is a set of inputs of its own (an encoder has none)."""
    if llama.memory:
        L.llama_memory_clear(llama.memory, True)
    if decode(llama, batch) != 0:
        return None
    out = np.empty((n_seqs, llama.n_pooled), dtype=np.float32)
    for seq in range(n_seqs):
        ptr = L.llama_get_embeddings_seq(llama.ctx, seq)
        if not ptr:
            return None
        out[seq] = np.ctypeslib.as_array(ptr, shape=(llama.n_pooled,))
    return out


def greedy_token(llama: LlamaModelContext, tokens: list[int]) -> int:
    """Decode `tokens` as sequence 0 and return the most likely next token (the startup self-check)."""
    batch = Batch(len(tokens))
    smpl = L.llama_sampler_init_greedy()
    try:
        for i, token in enumerate(tokens):
            batch.add(token, i, 0, i == len(tokens) - 1)
        if decode(llama, batch) != 0:
            raise RuntimeError("llama_decode failed on the self-check prompt")
        return int(L.llama_sampler_sample(smpl, llama.ctx, batch.n - 1))
    finally:
        L.llama_sampler_free(smpl)
        batch.free()


def logprobs_at(llama: LlamaModelContext, batch_index: int, token: int, k: int) -> tuple[float, list[tuple[int, float]]]:
    """`token`'s log-probability in the batch row `batch_index` (a log-softmax of the raw logits:
    the model's distribution before any sampler), and the `k` most likely tokens there."""
    row = np.ctypeslib.as_array(L.llama_get_logits_ith(llama.ctx, batch_index), shape=(llama.n_vocab,))
    peak = float(row.max())
    norm = peak + math.log(float(np.exp(row - peak).sum()))
    top: list[tuple[int, float]] = []
    if k > 0:
        best = np.argpartition(row, -k)[-k:]
        best = best[np.argsort(-row[best], kind="stable")]
        top = [(int(i), float(row[i]) - norm) for i in best]
    return float(row[token]) - norm, top


def argmax_at(llama: LlamaModelContext, batch_index: int) -> int:
    """The most likely token in the batch row `batch_index` (a draft model's greedy proposal)."""
    return int(np.ctypeslib.as_array(L.llama_get_logits_ith(llama.ctx, batch_index), shape=(llama.n_vocab,)).argmax())


class NoValidToken(RuntimeError):
    """Every token was ruled out (by the grammar): this request cannot go on."""


_NO_TOKEN = "the grammar allows no token at this point of the reply"


class _Candidates:
    """A reusable llama_token_data_array over the whole vocabulary, filled from a row of logits."""

    def __init__(self, n_vocab: int) -> None:
        self.n_vocab = n_vocab
        self.data = (L.llama_token_data * n_vocab)()
        self.view = np.ctypeslib.as_array(self.data)  # structured: id, logit, p
        self.ids = np.arange(n_vocab, dtype=np.int32)

    def load(self, logits: Any) -> Any:
        self.view["id"] = self.ids  # samplers sort and cut the array in place
        self.view["logit"] = np.ctypeslib.as_array(logits, shape=(self.n_vocab,))
        self.view["p"] = 0.0
        return L.llama_token_data_array(data=self.data, size=self.n_vocab, selected=-1, sorted=False)


class SamplerChain:
    """A request's private sampler chain (its own RNG seeded from the request's seed), and its grammar's
    `constraint` (llguidance), applied to the logits as the first stage: the chain samples from the
    tokens the grammar allows, as llama.cpp's grammar-first order does, at the cost of one mask. A grammar may be
    `deferred` (a reply that starts inside its reasoning: the grammar is the answer's, app/engine/reasoning_budget.py):
    it is built and checked, and applies from `resume` on."""

    def __init__(self, llama: LlamaModelContext, p: SamplingParams, grammar_tokenizer: Any = None,
                 keep_logits: bool = False) -> None:
        self.llama = llama
        self.params = p
        self.keep_logits = keep_logits  # the raw logits are read after sampling (logprobs): mask a copy
        # greedy without penalties: sampling a token changes no sampler's state, so it may be tried first
        self.stateless = p.temperature <= 0 and p.repeat_penalty == 1.0 and not p.frequency_penalty \
            and not p.presence_penalty
        self._candidates: _Candidates | None = None
        self.constraint: Constraint | None = None
        self.deferred = False
        self.chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        add = lambda s: L.llama_sampler_chain_add(self.chain, s)  # noqa: E731
        if p.logit_bias:
            biases = (L.llama_logit_bias * len(p.logit_bias))(*[L.llama_logit_bias(t, b) for t, b in p.logit_bias])
            add(L.llama_sampler_init_logit_bias(L.llama_vocab_n_tokens(llama.vocab), len(p.logit_bias), biases))
        if p.grammar:
            try:
                self.constraint = Constraint(grammar_tokenizer, p.grammar, llama.n_vocab)
            except GrammarRefused as exc:
                # A grammar refused against this vocabulary is the client's bad input, never a crash.
                self.free()
                if exc.unsatisfiable:
                    raise bad_input(f"The request's grammar cannot be satisfied: no token can start the "
                                    f"reply ({exc}).", "grammar", "grammar_unsatisfiable") from None
                raise bad_input(f"The grammar cannot be followed with this model's vocabulary: {exc}",
                                "grammar", "invalid_grammar") from None
        if p.repeat_penalty != 1.0 or p.frequency_penalty or p.presence_penalty:
            add(L.llama_sampler_init_penalties(L.llama_vocab_n_tokens(llama.vocab), p.penalty_last_n,
                                               p.repeat_penalty, p.frequency_penalty, p.presence_penalty))
        if p.infill:
            self.stateless = False  # the infill sampler reshapes the row: the greedy token cannot be tried first
        if p.temperature <= 0:
            if p.infill:
                add(L.llama_sampler_init_infill(llama.vocab))
            add(L.llama_sampler_init_greedy())
        else:
            if p.top_k > 0:
                add(L.llama_sampler_init_top_k(p.top_k))
            if p.top_p < 1.0:
                add(L.llama_sampler_init_top_p(p.top_p, 1))
            if p.min_p > 0.0:
                add(L.llama_sampler_init_min_p(p.min_p, 1))
            if p.infill:
                add(L.llama_sampler_init_infill(llama.vocab))
            add(L.llama_sampler_init_temp(p.temperature))
            add(L.llama_sampler_init_dist(p.resolved_seed()))

    @property
    def active_constraint(self) -> Constraint | None:
        """The grammar that applies to the next token (None: none, or one deferred)."""
        return None if self.deferred else self.constraint

    def resume(self) -> None:
        """A deferred grammar applies from the next token on (the reasoning before the answer has ended)."""
        self.deferred = False

    def advance(self, tokens: Sequence[int], grammar_from: int | None = 0) -> bool:
        """Move the samplers past `tokens` generated earlier under the same grammar (a continued reply): the
        penalties' history, and the grammar's state from `tokens[grammar_from]` on (None: the grammar is still
        deferred). False if the tokens do not fit the grammar (nothing is taken then: the caller frees the
        sampler)."""
        if self.constraint is not None and grammar_from is not None:
            if not self.constraint.advance(tokens[grammar_from:]):
                return False
            self.deferred = False
        for token in tokens:
            L.llama_sampler_accept(self.chain, token)
        return True

    def accepts(self, tokens: Sequence[int]) -> bool:
        """Whether the grammar in force allows `tokens` next (its state unchanged)."""
        constraint = self.active_constraint
        return constraint is None or constraint.accepts(tokens)

    def take(self, token: int) -> None:
        """`token` comes next without being sampled (a forced reasoning close): the samplers' histories and the
        grammar in force take it as if it had been sampled (the caller checked the grammar allows it)."""
        L.llama_sampler_accept(self.chain, token)
        constraint = self.active_constraint
        if constraint is not None and not self.llama.is_eog(token):
            constraint.take(token)

    def sample(self, batch_index: int) -> int:
        if self.constraint is None or self.deferred:
            # llama_sampler_sample also accepts the token into every sampler (the penalties' history).
            return int(L.llama_sampler_sample(self.chain, self.llama.ctx, batch_index))
        if not self.keep_logits:
            if self.stateless and not self.constraint.fresh:
                # No mask ready (no spare core computed it beside the decode): the token greedy picks is
                # checked first (microseconds); only when the grammar refuses it is the mask computed.
                # Greedy picks what it would pick from the masked row: the best token, if allowed, is the
                # best allowed one.
                token = int(L.llama_sampler_sample(self.chain, self.llama.ctx, batch_index))
                if self.constraint.allows(token):
                    if not self.llama.is_eog(token):
                        self.constraint.take(token)
                    return token
            # The mask written into llama.cpp's own row of logits, then its sampler as for any request:
            # one pass over the row beyond an unconstrained token's cost.
            row = np.ctypeslib.as_array(L.llama_get_logits_ith(self.llama.ctx, batch_index),
                                        shape=(self.llama.n_vocab,))
            if not self.constraint.restrict(row):
                raise NoValidToken(self.constraint.error() or _NO_TOKEN)
            token = int(L.llama_sampler_sample(self.chain, self.llama.ctx, batch_index))
        else:
            # The row stays the model's own (its logprobs are read from it after sampling): masked in a copy.
            cur = self._load(batch_index)
            assert self._candidates is not None
            if not self.constraint.restrict(self._candidates.view["logit"]):
                raise NoValidToken(self.constraint.error() or _NO_TOKEN)
            L.llama_sampler_apply(self.chain, ctypes.byref(cur))
            selected = self._selected(cur)
            if selected is None:
                raise NoValidToken(_NO_TOKEN)
            token = selected
            L.llama_sampler_accept(self.chain, token)
        if not self.llama.is_eog(token):  # an end of generation ends the sequence: nothing follows it
            self.constraint.take(token)
        return token

    def _load(self, batch_index: int) -> Any:
        if self._candidates is None:
            self._candidates = _Candidates(L.llama_vocab_n_tokens(self.llama.vocab))
        return self._candidates.load(L.llama_get_logits_ith(self.llama.ctx, batch_index))

    @staticmethod
    def _selected(cur: Any) -> int | None:
        """The token the samplers chose in `cur`; None when they had none to choose (all ruled out)."""
        chosen = cur.selected
        if not 0 <= chosen < cur.size or not math.isfinite(cur.data[chosen].logit):
            return None
        return int(cur.data[chosen].id)

    def free(self) -> None:
        if self.chain:
            L.llama_sampler_free(self.chain)
            self.chain = None
        self.constraint = None
