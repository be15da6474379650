"""The keys file: policies by key hash, errors with their line, reloads that keep the policies in force."""

from __future__ import annotations

import os

import pytest

from app.tenants.policies import KeyPolicies, KeysFileError, key_hash, parse_key_policies
from app.tenants.registry import KeyRegistry

A, B = "sk-team-a-0123456789", "sk-team-b-9876543210"

GOOD = f"""# two teams
keys:
  - name: team-a
    key_sha256: {key_hash(A)}
    requests_per_minute: 60
    tokens_per_minute: 1000
    max_concurrent: 4
    token_budget: {{tokens: 5000, per: day}}
    models: [smollm2]
    priority: high
  - name: team-b
    key_sha256: {key_hash(B)}
"""


def test_policies_are_found_by_the_key_they_hash() -> None:
    policies = KeyPolicies.of(parse_key_policies(GOOD))
    a = policies.find(A.encode())
    assert a is not None and a.name == "team-a" and a.requests_per_minute == 60 and a.token_budget.per == "day"
    assert a.weight > policies.find(B.encode()).weight and a.limited
    assert not policies.find(B.encode()).limited
    assert policies.find(b"sk-unknown") is None
    assert A not in GOOD  # the file holds hashes only


@pytest.mark.parametrize("edit, line, words", [
    (lambda t: t.replace("    priority: high\n", "    priority: high\n    burst: 3\n"), 11, "unknown field `burst`"),
    (lambda t: t.replace("requests_per_minute: 60", "requests_per_minute: -1"), 5, "requests_per_minute"),
    (lambda t: t.replace("requests_per_minute: 60", "requests_per_minute: .nan"), 5, "requests_per_minute"),
    (lambda t: t.replace("requests_per_minute: 60", "requests_per_minute: '60'"), 5, "requests_per_minute"),
    (lambda t: t.replace("per: day", "per: week"), 8, "token_budget.per"),
    (lambda t: t.replace("name: team-b", "name: team-a"), 11, "duplicate name"),
    (lambda t: t.replace(key_hash(B), key_hash(A)), 12, "duplicate key_sha256"),
    (lambda t: t.replace(f"    key_sha256: {key_hash(B)}\n", ""), 11, "missing field `key_sha256`"),
    (lambda t: t.replace(key_hash(B), "not-a-hash"), 12, "key_sha256"),
    (lambda t: t.replace("name: team-b", "name: 'bad name'"), 11, "name"),
    (lambda t: t.replace("priority: high", "priority: urgent"), 10, "priority"),
    (lambda t: t.replace("models: [smollm2]", "models: [1, 2]"), 9, "models"),
    (lambda t: t.replace("  - name: team-b", "  - name: [team-b"), 12, "not valid YAML"),
])
def test_a_bad_file_names_its_line(edit, line: int, words: str) -> None:
    with pytest.raises(KeysFileError) as caught:
        parse_key_policies(edit(GOOD), "keys.yaml")
    assert str(caught.value).startswith(f"keys.yaml:{line}:"), str(caught.value)
    assert words in str(caught.value)


def test_a_file_that_is_not_a_mapping_is_refused() -> None:
    with pytest.raises(KeysFileError, match="keys.yaml:1: a keys file is a mapping"):
        parse_key_policies("- a\n- b\n", "keys.yaml")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_file_is_reread_when_it_changes_and_a_bad_one_keeps_the_keys_in_force(tmp_path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(GOOD)
    clock, events = Clock(), []
    registry = KeyRegistry(["sk-env-key-000000"], str(path), check_every_s=2.0, clock=clock,
                           on_reload=lambda ok, message: events.append((ok, message)))
    assert registry.find(A.encode()).requests_per_minute == 60
    assert registry.find(b"sk-env-key-000000").name.startswith("key-")

    path.write_text(GOOD.replace("requests_per_minute: 60", "requests_per_minute: 5"))
    os.utime(path, ns=(1, 10**18))
    assert registry.find(A.encode()).requests_per_minute == 60  # not looked at again before check_every_s
    clock.now = 2.5
    assert registry.find(A.encode()).requests_per_minute == 5 and events[-1][0]

    path.write_text(GOOD.replace("priority: high", "priority: high\n    typo: 1"))
    os.utime(path, ns=(1, 2 * 10**18))
    clock.now = 5.0
    assert registry.find(A.encode()).requests_per_minute == 5  # the policies in force stay
    assert events[-1][0] is False and ":11:" in events[-1][1] and "typo" in events[-1][1]
    clock.now = 8.0
    assert registry.find(A.encode()) is not None and len(events) == 2  # not re-read until it changes again


def test_a_plain_file_still_works_as_unlimited_keys(tmp_path) -> None:
    path = tmp_path / "keys.txt"
    path.write_text("# ops\nsk-plain-one\n\nsk-plain-two\n")
    registry = KeyRegistry([], str(path))
    assert registry.enabled and not registry.find(b"sk-plain-two").limited
    assert registry.find(b"sk-plain-three") is None


def test_a_bad_file_at_start_is_fatal(tmp_path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(GOOD.replace("priority: high", "prority: high"))
    with pytest.raises(KeysFileError, match=":10:"):
        KeyRegistry([], str(path))


def test_hash_key_prints_what_the_file_stores_and_new_keys_parse(monkeypatch, capsys) -> None:
    import io

    from app.ops.cli import main

    monkeypatch.setattr("sys.stdin", io.StringIO(A + "\n"))
    assert main(["hash-key"]) == 0
    assert capsys.readouterr().out.strip() == key_hash(A)
    assert main(["hash-key", "--new", "team-c"]) == 0
    out = capsys.readouterr()
    key = out.err.rsplit(": ", 1)[1].strip()
    [policy] = parse_key_policies("keys:\n" + out.out)
    assert policy.name == "team-c" and policy.key_sha256 == key_hash(key) and key.startswith("sk-")
