"""The cache scope of a request: per API key (unless shared) and per `cache_salt`."""

from app.generation.caller import ANONYMOUS, Caller, cache_scope


def test_scopes_differ_by_key_and_salt():
    a, b = Caller.with_key(b"key-a"), Caller.with_key(b"key-b")
    assert a == Caller.with_key(b"key-a") and a.key_id != b.key_id
    assert cache_scope(a, None) != cache_scope(b, None)
    assert cache_scope(a, "s1") != cache_scope(a, "s2") != cache_scope(a, None)
    assert cache_scope(ANONYMOUS, None) == ""  # no keys, no salt: one shared scope


def test_shared_isolation_ignores_the_key_but_not_the_salt():
    a, b = Caller.with_key(b"key-a"), Caller.with_key(b"key-b")
    assert cache_scope(a, None, per_key=False) == cache_scope(b, None, per_key=False) == ""
    assert cache_scope(a, "s", per_key=False) == cache_scope(b, "s", per_key=False) != ""
