"""A minimal reference driver for llama.cpp's mtmd: one prompt with images in, the greedy answer out.

It uses only llama-cpp-python's low-level bindings (llama_cpp.mtmd_cpp: mtmd_init_from_file,
mtmd_bitmap_init, mtmd_tokenize, mtmd_helper_eval_chunks, then greedy sampling), none of the serving
engine, so the engine's image path can be compared with it. (llama-cpp-python's own MTMDChatHandler
fails on these models: "all entries in the batch must have the same content types".)
"""

from __future__ import annotations

import ctypes
from typing import Self

import llama_cpp as L
from llama_cpp import mtmd_cpp as M

from app.engine.llama import init_backend


class MtmdChat:
    """A chat model and its projector, loaded once; `answer` runs one prompt from an empty context."""

    def __init__(self, model_path: str, mmproj_path: str, *, n_ctx: int = 2048, n_threads: int = 2) -> None:
        init_backend()
        self.model = self.ctx = self.mtmd = self.sampler = None
        try:
            self.model = L.llama_model_load_from_file(str(model_path).encode(), L.llama_model_default_params())
            if not self.model:
                raise RuntimeError(f"llama.cpp could not load the model at {model_path}")
            self.vocab = L.llama_model_get_vocab(self.model)
            cparams = L.llama_context_default_params()
            cparams.n_ctx = n_ctx
            cparams.n_batch = cparams.n_ubatch = 512
            cparams.n_threads = cparams.n_threads_batch = n_threads
            self.ctx = L.llama_init_from_model(self.model, cparams)
            if not self.ctx:
                raise RuntimeError("llama.cpp could not create a context")
            mparams = M.mtmd_context_params_default()
            mparams.use_gpu = False
            mparams.n_threads = n_threads
            mparams.print_timings = False
            mparams.warmup = False
            self.mtmd = M.mtmd_init_from_file(str(mmproj_path).encode(), self.model, mparams)
            if not self.mtmd:
                raise RuntimeError(f"mtmd could not load the projector at {mmproj_path}")
            self.marker = M.mtmd_default_marker().decode()
            self.sampler = L.llama_sampler_init_greedy()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.sampler:
            L.llama_sampler_free(self.sampler)
        if self.mtmd:
            M.mtmd_free(self.mtmd)
        if self.ctx:
            L.llama_free(self.ctx)
        if self.model:
            L.llama_model_free(self.model)
        self.model = self.ctx = self.mtmd = self.sampler = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def chunks(self, prompt: str, images: list[tuple[int, int, bytes]]):
        """mtmd's chunks for `prompt` (each `self.marker` in it takes the next image, (width, height, RGB
        bytes)): a list of (kind, n_tokens), kind "text" or "image"."""
        handle = self._tokenize(prompt, images)
        try:
            kinds = {M.MTMD_INPUT_CHUNK_TYPE_TEXT: "text", M.MTMD_INPUT_CHUNK_TYPE_IMAGE: "image"}
            out = []
            for i in range(M.mtmd_input_chunks_size(handle)):
                chunk = M.mtmd_input_chunks_get(handle, i)
                out.append((kinds.get(M.mtmd_input_chunk_get_type(chunk), "other"),
                            M.mtmd_input_chunk_get_n_tokens(chunk)))
            return out
        finally:
            M.mtmd_input_chunks_free(handle)

    def image_embeddings(self, width: int, height: int, rgb: bytes):
        """What the projector makes of one image: (n_tokens, n_embd) float32, the rows that take the image's
        place in the prompt."""
        import numpy as np

        handle = self._tokenize(self.marker, [(width, height, rgb)])
        try:
            for i in range(M.mtmd_input_chunks_size(handle)):
                chunk = M.mtmd_input_chunks_get(handle, i)
                if M.mtmd_input_chunk_get_type(chunk) == M.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                    if M.mtmd_encode_chunk(self.mtmd, chunk) != 0:
                        raise RuntimeError("mtmd_encode_chunk failed")
                    n = M.mtmd_input_chunk_get_n_tokens(chunk)
                    width = L.llama_model_n_embd(self.model)
                    embd = M.mtmd_get_output_embd(self.mtmd)
                    return np.ctypeslib.as_array(embd, shape=(n * width,)).reshape(n, width).copy()
            raise RuntimeError("mtmd made no image chunk")
        finally:
            M.mtmd_input_chunks_free(handle)

    def answer(self, prompt: str, images: list[tuple[int, int, bytes]], max_tokens: int = 8) -> str:
        """The greedy completion of `prompt` (special tokens parsed; no BOS added), up to an end-of-generation
        token or `max_tokens`."""
        handle = self._tokenize(prompt, images)
        try:
            L.llama_memory_clear(L.llama_get_memory(self.ctx), True)
            n_past = L.llama_pos(0)
            rc = M.mtmd_helper_eval_chunks(self.mtmd, self.ctx, handle, 0, 0, 512, True, ctypes.byref(n_past))
            if rc != 0:
                raise RuntimeError(f"mtmd_helper_eval_chunks failed: {rc}")
        finally:
            M.mtmd_input_chunks_free(handle)
        pieces = []
        for _ in range(max_tokens):
            token = L.llama_sampler_sample(self.sampler, self.ctx, -1)
            if L.llama_vocab_is_eog(self.vocab, token):
                break
            buf = ctypes.create_string_buffer(64)
            n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
            pieces.append(buf.raw[: max(n, 0)])
            one = (L.llama_token * 1)(token)
            batch = L.llama_batch_get_one(one, 1)
            if L.llama_decode(self.ctx, batch) != 0:
                raise RuntimeError("llama_decode failed")
        return b"".join(pieces).decode("utf-8", errors="replace")

    def _tokenize(self, prompt: str, images: list[tuple[int, int, bytes]]):
        bitmaps = []
        handle = M.mtmd_input_chunks_init()
        try:
            for width, height, rgb in images:
                if len(rgb) != width * height * 3:
                    raise ValueError(f"{width}x{height} RGB needs {width * height * 3} bytes, got {len(rgb)}")
                data = (ctypes.c_uint8 * len(rgb)).from_buffer_copy(rgb)
                bitmap = M.mtmd_bitmap_init(width, height, data)
                if not bitmap:
                    raise RuntimeError("mtmd_bitmap_init failed")
                bitmaps.append(bitmap)
            encoded = prompt.encode()
            text = M.mtmd_input_text(encoded, len(encoded), False, True)
            array = (M.mtmd_bitmap_p_ctypes * len(bitmaps))(*bitmaps)
            rc = M.mtmd_tokenize(self.mtmd, handle, ctypes.byref(text), array, len(bitmaps))
            if rc != 0:
                raise RuntimeError(f"mtmd_tokenize failed: {rc} (1: markers and images differ in number)")
            return handle
        except BaseException:
            M.mtmd_input_chunks_free(handle)
            raise
        finally:
            for bitmap in bitmaps:
                M.mtmd_bitmap_free(bitmap)
