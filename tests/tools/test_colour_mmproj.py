"""The hand-built colour projector (tools/colour_mmproj.py), loaded by llama.cpp's mtmd beside the bundled
SmolLM2-135M-Instruct through the low-level driver in tests/support/mtmd_chat.py: a one-colour image
becomes exactly its colour word's token embeddings, and the chat model, asked greedily, names the colour."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests.support.mtmd_chat import MtmdChat
from tools import colour_mmproj

# The colours and phrasings whose greedy answers were right every time when measured (the table in
# tools/colour_mmproj.py's docstring); the others are too often wrong to assert on.
# Each colour's right answers: the word the image reads as (magenta reads as " pink") and its synonyms.
ROBUST = {"red": {"red"}, "green": {"green"}, "blue": {"blue"}, "yellow": {"yellow"},
          "magenta": {"pink", "purple", "magenta"}, "white": {"white"}, "black": {"black"}}
PHRASINGS = {
    "image first": "{image}What colour is this image? Answer in one word.",
    "question first": "What colour is this image? Answer in one word.\n{image}",
}
COLOUR_WORDS = {"red", "green", "blue", "yellow", "cyan", "pink", "magenta", "purple", "white", "black", "orange",
                "grey", "gray", "brown", "turquoise", "aqua", "teal"}


def one_colour(rgb: tuple[int, int, int], width: int = 40, height: int = 40) -> tuple[int, int, bytes]:
    return width, height, bytes(rgb) * (width * height)


@pytest.fixture(scope="module")
def chat():
    with MtmdChat(str(colour_mmproj.chat_model_path()), str(colour_mmproj.cached_gguf())) as chat:
        yield chat


def test_the_projector_is_small_and_the_same_every_build(tmp_path):
    first, second = tmp_path / "a.gguf", tmp_path / "b.gguf"
    colour_mmproj.build(first)
    colour_mmproj.build(second)
    assert first.read_bytes() == second.read_bytes()
    assert first.stat().st_size < 2 << 20


def test_the_cache_builds_once_under_its_version(tmp_path, monkeypatch):
    monkeypatch.setattr(colour_mmproj, "CACHE_DIR", tmp_path)
    path = colour_mmproj.cached_gguf()
    assert path.parent == tmp_path and f"v{colour_mmproj.VERSION}" in path.name
    built = path.stat().st_mtime_ns
    assert colour_mmproj.cached_gguf() == path and path.stat().st_mtime_ns == built
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name, path.name + ".lock"]  # no temporary left


@pytest.mark.parametrize("colour", list(colour_mmproj.COLOURS))
def test_a_one_colour_image_becomes_its_colour_words_embeddings(chat, colour):
    expected = colour_mmproj.phrase_embeddings(colour_mmproj.chat_model_path())
    index = list(colour_mmproj.COLOURS).index(colour)
    got = chat.image_embeddings(*one_colour(colour_mmproj.RGB[colour]))
    assert got.shape == (colour_mmproj.N_PATCHES, expected.shape[2])
    np.testing.assert_allclose(got, expected[:, index], atol=2e-3)


def test_a_colour_between_the_corners_becomes_no_colour_word(chat):
    got = chat.image_embeddings(*one_colour((128, 128, 128)))  # grey: no channel clearly on or off
    assert np.abs(got).max() < 1e-3


def test_the_image_fills_its_place_in_the_prompt(chat):
    prompt = f"<|im_start|>user\nbefore {chat.marker} after<|im_end|>\n"
    chunks = chat.chunks(prompt, [one_colour((255, 0, 0), 100, 60)])
    assert [kind for kind, _ in chunks] == ["text", "image", "text"]
    assert chunks[1][1] == colour_mmproj.N_PATCHES  # any size is resized to one square


@pytest.mark.parametrize("phrasing", list(PHRASINGS))
@pytest.mark.parametrize("colour", ROBUST)
def test_the_chat_model_names_the_images_colour(chat, colour, phrasing):
    question = PHRASINGS[phrasing].format(image=chat.marker)
    prompt = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    answer = chat.answer(prompt, [one_colour(colour_mmproj.RGB[colour])], max_tokens=12)
    words = set(re.findall(r"[a-z]+", answer.lower()))
    assert words & ROBUST[colour], answer
    assert not words & (COLOUR_WORDS - ROBUST[colour]), answer
