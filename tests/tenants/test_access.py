"""What a key may reach (app/tenants/access.py): exact ids only, adapters only when named or `<model>:*`, and the
base weights (adapters all at scale 0) only when the base is allowed; property tests over ids with colons,
slashes, case and Unicode look-alikes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from app.tenants.access import may_use
from app.tenants.policies import KeyPolicy

HASH = "0" * 64


def policy(*models: str) -> KeyPolicy:
    return KeyPolicy(name="k", key_sha256=HASH, models=tuple(models))


def test_no_policy_and_no_models_allow_everything() -> None:
    assert may_use(None, "anything", (("x", 1.0),))
    assert may_use(KeyPolicy(name="k", key_sha256=HASH), "anything:at:all", (("x", 1.0),))


def test_a_model_listed_is_that_model_alone() -> None:
    p = policy("tiny")
    assert may_use(p, "tiny")
    assert not may_use(p, "tiny:v2")  # a pool's model called tiny:v2 is another model
    assert not may_use(p, "tiny", (("support", 1.0),))  # nor an adapter of tiny
    assert not may_use(p, "tiny", (("support", 0.0),))  # named at scale 0: named all the same
    assert not may_use(p, "tin") and not may_use(p, "tinyx") and not may_use(p, "TINY")


def test_an_adapter_listed_is_that_adapter_alone() -> None:
    p = policy("tiny:support")
    assert may_use(p, "tiny", (("support", 1.0),)) and may_use(p, "tiny", (("support", -0.5),))
    assert not may_use(p, "tiny")  # the base weights
    assert not may_use(p, "tiny", (("support", 0.0),))  # every adapter at scale 0 is the base
    assert not may_use(p, "tiny", (("support", 1.0), ("other", 1.0)))  # `lora` adding another adapter
    assert not may_use(p, "tiny", (("support", 1.0), ("other", 0.0)))
    assert may_use(policy("tiny:support", "tiny:other"), "tiny", (("support", 1.0), ("other", 0.5)))


def test_all_adapters_written_out() -> None:
    p = policy("tiny:*")
    assert may_use(p, "tiny") and may_use(p, "tiny", (("a", 1.0), ("b", 0.0)))
    assert not may_use(p, "tiny:v2") and not may_use(p, "tiny:v2", (("a", 1.0),))
    assert not may_use(p, "other", (("a", 1.0),))


def test_a_model_whose_id_holds_colons() -> None:
    p = policy("org/repo:Q4_K_M")
    assert may_use(p, "org/repo:Q4_K_M")
    assert not may_use(p, "org/repo") and not may_use(p, "org/repo:Q8_0")
    assert not may_use(p, "org/repo:Q4_K_M", (("x", 1.0),))
    assert may_use(policy("org/repo:Q4_K_M:x"), "org/repo:Q4_K_M", (("x", 1.0),))


# Ids as clients and configs write them: colons (name:tag), slashes (org/repo), case, and look-alikes of ASCII
# letters (Cyrillic, Greek, fullwidth, a combining mark, a zero-width joiner).
LOOKALIKES = ["\u0430", "\u0435", "\u043e", "\u0456", "\u03bf", "\uff54", "e\u0301", "\u200d", "\u0131", "\u212a"]
PART = st.lists(st.sampled_from(list("abcdeiotyKT0123456789._-/") + LOOKALIKES), min_size=1, max_size=8).map("".join)
MODEL_ID = st.lists(PART, min_size=1, max_size=3).map(":".join)
ADAPTER = st.lists(st.sampled_from(list("abcdeiotK012._-") + LOOKALIKES), min_size=1, max_size=6).map("".join)


def variants(text: str) -> list[str]:
    """Ids a client might send instead of `text`: another case, an ASCII letter swapped for a look-alike, a
    prefix or an extension at a colon."""
    out = [text.upper(), text.lower(), text.swapcase(), text + ":x", text.rsplit(":", 1)[0], text + "*"]
    swaps = {"a": "\u0430", "e": "\u0435", "o": "\u043e", "i": "\u0456", "t": "\uff54"}
    out += [text.replace(a, b, 1) for a, b in swaps.items() if a in text]
    return [v for v in out if v != text]


@settings(max_examples=300, deadline=None)
@given(listed=MODEL_ID, asked=MODEL_ID, adapter=ADAPTER)
def test_a_key_reaches_exactly_what_it_lists(listed: str, asked: str, adapter: str) -> None:
    p = policy(listed)
    assert may_use(p, asked) == (asked == listed)
    for other in variants(listed):
        assert not may_use(p, other), other
    # Listing a model never lets its adapters in, whatever their names.
    assert not may_use(p, listed, ((adapter, 1.0),))
    assert not may_use(p, asked, ((adapter, 1.0),)) or f"{asked}:{adapter}" == listed


@settings(max_examples=300, deadline=None)
@given(model=MODEL_ID, adapter=ADAPTER, other=ADAPTER, scale=st.floats(-10, 10))
def test_an_adapter_entry_reaches_its_adapter_only(model: str, adapter: str, other: str, scale: float) -> None:
    p = policy(f"{model}:{adapter}")
    assert may_use(p, model, ((adapter, scale),)) == (scale != 0)
    assert may_use(p, model, ((adapter, 1.0), (other, scale))) == (other == adapter)
    for variant in variants(adapter):
        assert not may_use(p, model, ((variant, 1.0),)), variant
    for variant in variants(model):
        assert not may_use(p, variant, ((adapter, 1.0),)), variant
