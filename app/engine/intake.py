"""A generation request's way in: everything checked before it may be queued, and its prompt as tokens.

What the prompt's bytes already prove is checked before the work of tokenizing it (a 4 MiB prompt for a
4k-token context is refused without being tokenized); the rest once its tokens and its images' positions are
known: the context, the logprob entries it may make, where its images fall. Every refusal is an engine error
(bad input, context exceeded) naming the field. Tokenizing and counting a prompt for the tokenizer routes go
through the same code, so a count is what a generation would see. Any thread (it reads the model, never the KV).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from . import prompt_marks
from .errors import ContextExceeded, bad_input, internal
from .infill import infill_tokens
from .params import IMAGE_MARKER, GenerationRequest, ImageInput, InfillPrompt
from .vision import ImageSpan, image_prompt, release_all

log = logging.getLogger("llamaray.engine")


@dataclass
class Admitted:
    """A request that passed intake: its prompt's tokens (continued reply included), its images' spans (their
    pixels preprocessed: release them if the request goes no further) and its generation limit (None: the
    context left)."""

    prompt: list[int]
    images: list[ImageSpan]
    limit: int | None


class Intake:
    def __init__(self, spec: Any, llama: Any, projector: Any, slots: int) -> None:
        self.spec = spec
        self.llama = llama
        self.projector = projector
        self.slots = slots
        self.n_ctx = spec.n_ctx
        self.closing = lru_cache(maxsize=16)(self._closing)

    def admit(self, req: GenerationRequest) -> Admitted:
        """The request checked and tokenized; an engine error for what it may not ask."""
        if req.n > self.slots:
            raise bad_input(f"`n` is {req.n}; model `{self.spec.id}` generates at most {self.slots} "
                            f"choices at once (its n_seq_max).", "n", "n_too_large")
        self._check_images(req)
        limit = req.max_tokens  # the request's, its default applied while planning (None: the context left)
        self._check_continuation(req.continue_tokens)
        if req.infill is not None and req.images:
            raise bad_input("A fill-in-the-middle prompt takes no images.", "images", "images_unsupported")
        # What the prompt's bytes already prove, before the work of tokenizing it (a fill-in-the-middle prompt's
        # parts are cut to fit, as llama-server cuts them: nothing to prove there).
        at_least = self._fewest_tokens(req.prompt) + len(req.continue_tokens)
        self._check_fits(at_least, limit, exact=False)
        self._check_logprobs(req, at_least, limit, exact=False)
        tokens, images = self._tokenize(req)
        prompt = tokens + list(req.continue_tokens)
        try:
            self._check_fits(len(prompt), limit, exact=True)
            self._check_logprobs(req, len(prompt), limit, exact=True)
            self._check_image_places(images, len(prompt))
        except BaseException:
            release_all(images)
            raise
        return Admitted(prompt, images, limit)

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        """`text`'s tokens as a prompt is counted (content marks honoured)."""
        return self.llama.tokenize_prompt(text, add_special)

    def infill(self, infill: InfillPrompt, limit: int | None) -> list[int]:
        """A fill-in-the-middle prompt's tokens (app/engine/infill.py) for a completion of at most `limit` tokens
        (None: the context left); bad input naming the model when its vocabulary has no FIM tokens."""
        return infill_tokens(self.llama, infill, model=self.spec.id, n_batch=self.spec.n_batch, n_ctx=self.n_ctx,
                             n_predict=limit)

    def _closing(self, message: str, marker: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """A reasoning's closing tokens (app/engine/reasoning_budget.py): `message` as text, then `marker` with its
        control token where the vocabulary has one; and the marker's alone. Few distinct ones: the models'."""
        end = self.llama.tokenize(marker, add_special=False, parse_special=True)
        text = self.llama.tokenize(message, add_special=False, parse_special=False) if message else []
        return tuple(text + end), tuple(end)

    def count_prompt(self, prompt: str, images: list[ImageInput]) -> int:
        """A rendered prompt's tokens as `admit` counts them, its images' positions included (the projector's
        preprocessing only: nothing is encoded)."""
        probe = GenerationRequest(request_id="count", prompt=prompt, images=images)
        self._check_images(probe)
        tokens, spans = self._tokenize(probe)
        release_all(spans)
        return len(tokens)

    def detokenize(self, tokens: list[int]) -> str:
        """The text of token ids; an id outside the vocabulary is bad input naming its place."""
        n_vocab = self.llama.n_vocab
        for i, token in enumerate(tokens):
            if not 0 <= token < n_vocab:
                raise bad_input(f"Token id {token} (tokens[{i}]) is not in the vocabulary of model "
                                f"`{self.spec.id}` (ids 0 to {n_vocab - 1}).", f"tokens[{i}]", "invalid_token")
        return self.llama.detokenize(tokens)

    def _check_images(self, req: GenerationRequest) -> None:
        if not req.images:
            return
        if self.projector is None:
            raise bad_input(f"Model `{self.spec.id}` takes no images (it has no multimodal projector, "
                            f"`mmproj_path`).", "images", "images_unsupported")
        if req.prompt_logprobs:
            # Image positions have no token to score, and their rows' logits were never computed.
            raise bad_input("Prompt logprobs (`echo`) are not available for prompts with images.",
                            "prompt_logprobs", "images_unsupported")

    def _tokenize(self, req: GenerationRequest) -> tuple[list[int], list[ImageSpan]]:
        """The prompt's tokens, and its image spans when it has images (their pixels preprocessed)."""
        if req.infill is not None:
            return self.infill(req.infill, req.max_tokens), []
        if not req.images:
            return self.llama.tokenize_prompt(req.prompt) or [self.llama.bos], []
        try:
            return image_prompt(self.llama, self.projector, req.prompt, req.images)
        except ValueError as exc:  # markers and images that do not pair up: the renderer's bug
            log.error("request %s: %s", req.request_id, exc)
            raise internal("The prompt's images do not match its image places.") from None
        except RuntimeError:
            log.exception("request %s: the projector could not take its images", req.request_id)
            raise internal("The model's projector could not read this request's images.") from None

    def _check_image_places(self, images: list[ImageSpan], prompt_tokens: int) -> None:
        """Each image decodes in one llama_decode where its rows must see each other (non-causal), and
        never last: the prompt's last position gives the logits to sample from."""
        n_ubatch = min(self.spec.n_batch, 512)
        for span in images:
            if span.non_causal and span.n_tokens > n_ubatch:
                raise bad_input(f"An image of this request takes {span.n_tokens} positions; model "
                                f"`{self.spec.id}` decodes at most {n_ubatch} at once (raise its n_batch).",
                                "images", "image_too_large")
        if images and images[-1].end >= prompt_tokens:
            raise bad_input("The prompt ends with an image; the model needs text after it.", "images", "image_at_end")

    def _fewest_tokens(self, prompt: str) -> int:
        """The fewest tokens `prompt` can make (0: not known for this vocabulary): its UTF-8 bytes over
        the longest token piece, our content marks not counted."""
        longest = self.llama.longest_piece
        if not longest:
            return 0
        size = len(prompt) if prompt.isascii() else len(prompt.encode("utf-8", "surrogatepass"))
        size -= len(IMAGE_MARKER) * prompt.count(IMAGE_MARKER)  # an image's tokens are no text (one at least)
        marks = prompt.count(prompt_marks.OPEN) + prompt.count(prompt_marks.CLOSE)
        if marks:  # marks (3 bytes each) and their JSON-escaped forms (\\ufdd0, 6 bytes) are no text
            size -= 3 * marks + 6 * (prompt.count("\\ufdd") + prompt.count("\\uFDD"))
        return -(-max(0, size) // longest)

    def _check_fits(self, prompt_tokens: int, limit: int | None, exact: bool) -> None:
        if prompt_tokens >= self.n_ctx or (limit is not None and prompt_tokens + limit > self.n_ctx):
            raise ContextExceeded(self.n_ctx, prompt_tokens, limit, at_least=not exact)

    def _check_continuation(self, tokens: list[int]) -> None:
        """Token ids to continue from reach llama.cpp as they are: one outside the vocabulary aborts it."""
        n_vocab = self.llama.n_vocab
        for i, token in enumerate(tokens):
            if not 0 <= token < n_vocab:
                raise bad_input(f"Token id {token} (continue_tokens[{i}]) is not in the vocabulary of model "
                                f"`{self.spec.id}`.", "continue_tokens", "invalid_token")

    def _check_logprobs(self, req: GenerationRequest, prompt_tokens: int, limit: int | None, exact: bool) -> None:
        """The logprob entries this generation may make, within its share of limits.max_logprob_entries:
        each is a TokenLogprob with `logprobs` alternatives, built, pickled and sent as JSON."""
        share = req.max_logprob_entries
        if share is None or (req.logprobs is None and not req.prompt_logprobs):
            return
        per = 1 + (req.logprobs or 0)
        scored = prompt_tokens if req.prompt_logprobs else 0
        generated = 0
        if req.logprobs is not None and limit is not None:
            generated = limit
        elif req.logprobs is not None and exact:  # the context left (from a bound on the prompt: unknown)
            generated = max(0, self.n_ctx - prompt_tokens)
        entries = (scored + generated * req.n) * per
        if entries <= share:
            return
        parts = []
        if scored:
            parts.append(f"{'at least ' if not exact else ''}{scored} prompt tokens scored")
        if generated:
            parts.append(f"up to {generated} generated tokens x {req.n} choices")
        raise bad_input(
            f"This request may produce {'at least ' if not exact else ''}{entries} logprob entries "
            f"({' + '.join(parts)}, each with 1 + {req.logprobs or 0} alternatives); at most {share} are allowed "
            f"for it (limits.max_logprob_entries, shared over the request's prompts). Ask for fewer `logprobs`, "
            f"a lower `max_tokens`, fewer choices or shorter prompts.", "logprobs", "logprobs_too_large")
