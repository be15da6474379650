"""Images in a prompt, through llama.cpp's multimodal library (mtmd) and the model's projector (mmproj).

A prompt with images is tokenized in pieces: the template's text between its IMAGE_MARKERs as any prompt
(llama.py, content marks honoured: a marker a client typed stays text), and each image by mtmd, which
gives the tokens the model wraps an image in (`<fake_token_around_image>`, rows and columns of slices)
and one or more image chunks: preprocessed pixels the projector turns into one embedding row per position.

The engine keeps such a prompt as one token list in which an image's positions hold pseudo ids drawn from
the image's digest (negative, so never a vocabulary id). Prefix reuse (slots, the prompt cache) compares
token lists, so it only ever matches KV computed from the same image; a match that ends inside an image
is cut back to the image's start (`image_boundary`), since half an image's KV is no prefix of anything.

An image chunk is encoded on the engine thread when its slot reaches it, so a reused prefix skips the
projector altogether; its rows are then decoded into the slot's KV as an embeddings batch of their own
(llama.cpp decodes tokens or embeddings in one batch, never both). Preprocessing (resize, normalize)
runs in `image_pieces`, on the caller's thread in `prepare`, as llama-server's HTTP threads do.

Only this module touches mtmd's ctypes. Every chunk it hands out is freed exactly once: by
`ImageSpan.release` (the engine calls it when the span is encoded or its generation leaves), counted in
`Projector.held` so tests see leaks.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
from llama_cpp import mtmd_cpp as M

from .llama import LlamaModelContext, _llama_log
from .params import IMAGE_MARKER, ImageInput

log = logging.getLogger("llamaray.vision")


class Projector:
    """One mtmd context: a projector GGUF bound to the loaded text model."""

    def __init__(self, path: str, llama: LlamaModelContext, n_threads: int, use_gpu: bool) -> None:
        # mtmd and clip log every image at info level to stderr; through llama.py's filter, warnings and
        # errors reach our log and the rest is dropped.
        M.mtmd_log_set(_llama_log, ctypes.c_void_p(0))
        M.mtmd_helper_log_set(_llama_log, ctypes.c_void_p(0))
        params = M.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.n_threads = n_threads
        params.print_timings = False
        params.media_marker = IMAGE_MARKER.encode()
        self.ctx = M.mtmd_init_from_file(path.encode(), llama.model, params)
        if not self.ctx:
            raise RuntimeError(f"llama.cpp could not load the projector at {path} for this model")
        self.llama = llama
        self.n_embd = llama.n_embd
        self._lock = threading.Lock()
        self.held = 0  # image chunks handed out and not yet freed
        self._warned_tokens = False
        if not M.mtmd_support_vision(self.ctx):
            self.close()
            raise RuntimeError(f"the projector at {path} takes no images")
        if M.mtmd_decode_use_mrope(self.ctx):
            # M-RoPE (Qwen2-VL and kin) gives each image position (t, x, y) coordinates; the engine
            # places every sequence position by one number.
            self.close()
            raise RuntimeError(f"the projector at {path} needs M-RoPE positions, which this server does not support")

    def image_pieces(self, image: ImageInput) -> list["list[int] | ImageSpan"]:
        """`image` as mtmd puts it in a prompt: runs of token ids and image spans (start not yet set),
        in order. Preprocesses the pixels (CPU work, no encoder). Any thread."""
        if len(image.rgb) != image.width * image.height * 3:
            raise ValueError(f"image {image.digest[:12]}: {len(image.rgb)} bytes for {image.width}x{image.height} RGB")
        data = ctypes.cast(ctypes.c_char_p(image.rgb), ctypes.POINTER(ctypes.c_uint8))
        bitmap = M.mtmd_bitmap_init(image.width, image.height, data)
        if not bitmap:
            raise RuntimeError("mtmd could not make a bitmap")
        chunks = M.mtmd_input_chunks_init()
        pieces: list[list[int] | ImageSpan] = []
        try:
            marker = IMAGE_MARKER.encode()
            text = M.mtmd_input_text(marker, len(marker), False, True)
            bitmaps = (M.mtmd_bitmap_p_ctypes * 1)(bitmap)
            rc = M.mtmd_tokenize(self.ctx, chunks, ctypes.byref(text), bitmaps, 1)
            if rc != 0:
                raise RuntimeError(f"mtmd_tokenize failed ({rc}) for image {image.digest[:12]}")
            part = 0
            for i in range(M.mtmd_input_chunks_size(chunks)):
                chunk = M.mtmd_input_chunks_get(chunks, i)
                kind = M.mtmd_input_chunk_get_type(chunk)
                if kind == M.MTMD_INPUT_CHUNK_TYPE_TEXT:
                    pieces.append(self._text_tokens(chunk))
                elif kind == M.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                    n = int(M.mtmd_input_chunk_get_n_tokens(chunk))
                    owned = self._own(M.mtmd_input_chunk_copy(chunk))
                    pieces.append(ImageSpan(self, owned, n, bool(M.mtmd_decode_use_non_causal(self.ctx, chunk)),
                                            pseudo_ids(image.digest, part, n)))
                    part += 1
                else:
                    raise RuntimeError(f"mtmd gave a chunk of type {kind} for an image")
        except BaseException:
            for piece in pieces:
                if isinstance(piece, ImageSpan):
                    piece.release()
            raise
        finally:
            M.mtmd_input_chunks_free(chunks)
            M.mtmd_bitmap_free(bitmap)
        return pieces

    def _text_tokens(self, chunk: Any) -> list[int]:
        n = ctypes.c_size_t()
        ptr = M.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
        tokens = [int(t) for t in ptr[:n.value]] if ptr else []
        valid = [t for t in tokens if 0 <= t < self.llama.n_vocab]
        if len(valid) < len(tokens) and not self._warned_tokens:
            # mtmd looks the projector's wrapping tokens up in the model's vocabulary; a model without them
            # was not trained with this projector. Decoding them would fail every image request.
            log.warning("the projector's image-wrapping tokens are not all in the model's vocabulary: "
                        "%d of %d dropped (is this the model's own projector?)", len(tokens) - len(valid), len(tokens))
            self._warned_tokens = True
        return valid

    def _own(self, chunk: Any) -> Any:
        if not chunk:
            raise RuntimeError("mtmd could not copy an image chunk")
        with self._lock:
            self.held += 1
        return chunk

    def free_chunk(self, chunk: Any) -> None:
        M.mtmd_input_chunk_free(chunk)
        with self._lock:
            self.held -= 1

    def encode(self, span: "ImageSpan") -> np.ndarray:
        """The span's embedding rows (n_tokens, n_embd float32, a copy): the projector's work, on the
        engine thread (mtmd's context is not shared between concurrent encodes)."""
        if span.chunk is None:
            raise RuntimeError("the image chunk was already freed")
        rc = M.mtmd_encode_chunk(self.ctx, span.chunk)
        if rc != 0:
            raise RuntimeError(f"the projector failed to encode an image ({rc})")
        out = M.mtmd_get_output_embd(self.ctx)
        if not out:
            raise RuntimeError("the projector gave no embeddings")
        return np.ctypeslib.as_array(out, shape=(span.n_tokens, self.n_embd)).copy()

    def close(self) -> None:
        if self.ctx:
            M.mtmd_free(self.ctx)
            self.ctx = None


@dataclass(eq=False)
class ImageSpan:
    """One image chunk's positions in a prompt, and what fills them."""

    projector: Projector
    chunk: Any                 # the preprocessed image (owned mtmd_input_chunk) until encoded or released
    n_tokens: int
    non_causal: bool           # its rows must see each other: decoded in one batch, causal mask off
    ids: list[int]             # its pseudo token ids (pseudo_ids)
    start: int = -1            # prompt position of its first row
    embd: np.ndarray | None = None  # the encoded rows, kept while another choice may need to decode them

    @property
    def end(self) -> int:
        return self.start + self.n_tokens

    def release(self) -> None:
        """Free the preprocessed image (idempotent)."""
        chunk, self.chunk = self.chunk, None
        if chunk is not None:
            self.projector.free_chunk(chunk)


def pseudo_ids(digest: str, part: int, n: int) -> list[int]:
    """Negative ids for the `n` positions of image chunk `part` of the image with `digest`: equal for
    the same image, and different images differ at their first position but for a 2^-31 chance
    (a longer accidental match is cut back to the image's start by image_boundary)."""
    seed = int.from_bytes(hashlib.sha256(f"{digest}:{part}".encode()).digest()[:8], "little")
    return (-np.random.default_rng(seed).integers(1, 2**31, size=n)).tolist()


def image_prompt(llama: LlamaModelContext, projector: Projector, prompt: str,
                 images: list[ImageInput]) -> tuple[list[int], list[ImageSpan]]:
    """A rendered prompt with `images` (one per template-written IMAGE_MARKER, in order): its token
    list (pseudo ids at image positions) and its image spans. ValueError when the markers and the
    images do not pair up (a bug of the prompt's renderer)."""
    segments = llama.tokenize_segments(prompt, IMAGE_MARKER)
    if len(segments) - 1 != len(images):
        raise ValueError(f"the prompt has {len(segments) - 1} image markers for {len(images)} images")
    tokens, spans = list(segments[0]), []
    try:
        for image, after in zip(images, segments[1:]):
            for piece in projector.image_pieces(image):
                if isinstance(piece, ImageSpan):
                    piece.start = len(tokens)
                    spans.append(piece)
                    tokens += piece.ids
                else:
                    tokens += piece
            tokens += after
    except BaseException:
        release_all(spans)
        raise
    return tokens, spans


def release_all(spans: list[ImageSpan]) -> None:
    for span in spans:
        span.release()


def image_boundary(n: int, spans: list[ImageSpan]) -> int:
    """`n` reused prefix tokens, cut back to the start of an image it would end inside."""
    for span in spans:
        if span.start < n < span.end:
            return span.start
        if span.start >= n:
            break
    return n


def next_image(pos: int, spans: list[ImageSpan]) -> ImageSpan | None:
    """The first image span starting at or after prompt position `pos`."""
    return next((s for s in spans if s.start >= pos), None)
