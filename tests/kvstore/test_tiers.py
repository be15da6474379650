"""The persistent KV tiers without a model (app/kvstore): entries found by their tokens in their scope only, read
back only when whole and their own, a disk that stays within its bound, a store shared through fsspec, same-entry
writers leaving one good copy, and failing tiers set aside while the others serve."""

from __future__ import annotations

import errno
import os
import re
import threading

import numpy as np
import pytest

from app.kvstore.entry import EntryError, decode_index, encode_index, entry_name, index_record
from app.kvstore.key import StoreKey, file_sha256, scope_digest
from app.kvstore.tier import DiskTier, StoreTier
from app.kvstore.tiers import TieredStore

KEY = StoreKey(model="a" * 64, engine="test", n_ctx=1024, type_k="f16", type_v="f16", flash_attn="auto")
OTHER_MODEL = StoreKey(model="b" * 64, engine="test", n_ctx=1024, type_k="f16", type_v="f16", flash_attn="auto")
SCOPE, OTHER_SCOPE = scope_digest("key-a"), scope_digest("key-b")


def tokens(n: int, start: int = 0) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.int32)


def state(n: int, fill: int = 7) -> bytes:
    return bytes([fill]) * n


def store(*tiers, key=KEY, min_tokens: int = 8) -> TieredStore:
    s = TieredStore(list(tiers), lambda: key, min_tokens=min_tokens).start()
    assert s.wait_ready(10)
    return s


def test_keys_scopes_and_names_are_digests_whatever_a_client_sends():
    assert re.fullmatch(r"[0-9a-f]{32}", KEY.digest()) and KEY.digest() != OTHER_MODEL.digest()
    hostile = scope_digest("../../etc/passwd\x00", (("..", 1.0),))
    assert re.fullmatch(r"[0-9a-f]{32}", hostile)
    assert re.fullmatch(r"[0-9a-f]{40}", entry_name(KEY.digest(), hostile, tokens(4)))
    # Adapters at scale 0 are the base model: the same scope as none.
    assert scope_digest("s", (("x", 0.0),)) == scope_digest("s") != scope_digest("s", (("x", 1.0),))


def test_a_record_is_read_back_only_for_its_own_model_and_scope():
    record = index_record(KEY.digest(), SCOPE, tokens(40), state(100))
    data = encode_index(record)
    assert decode_index(data, KEY.digest(), SCOPE).tokens.tolist() == tokens(40).tolist()
    for key, scope in ((OTHER_MODEL.digest(), SCOPE), (KEY.digest(), OTHER_SCOPE)):
        with pytest.raises(EntryError):
            decode_index(data, key, scope)
    forged = data.replace(b'"size": 100', b'"size": 99').replace(record.name.encode(), b"0" * 40)
    for bad in (b"", b"{", b"[]", forged, data[:-10], b"x" * (17 << 20)):
        with pytest.raises(EntryError):
            decode_index(bad, KEY.digest())


def test_the_longest_prefix_in_the_prompts_scope_is_found_and_read(tmp_path):
    s = store(DiskTier(tmp_path, 1 << 30))
    s.save(tokens(20), state(50, 1), 50, SCOPE)
    s.save(tokens(40), state(60, 2), 60, SCOPE)
    s.save(tokens(60), state(70, 3), 70, OTHER_SCOPE)  # another key's, longer
    assert s.flush()
    prompt = tokens(100)
    match = s.longest(prompt, SCOPE)
    assert (match.tier, match.shared, match.record.size) == ("disk", 40, 60)
    assert s.fetch(match) == state(60, 2)
    assert s.longest(prompt, scope_digest("key-c")) is None  # no scope sees another's
    assert s.longest(tokens(100, start=1), SCOPE) is None  # a prompt that differs at once
    assert s.longest(tokens(5), SCOPE).shared == 5  # a short match is found: whether it pays is the engine's call
    s.close()
    # Another process (a new replica) on this node finds them on disk.
    again = store(DiskTier(tmp_path, 1 << 30))
    assert again.longest(prompt, SCOPE).shared == 40 and again.stats()["tiers"]["disk"]["entries"] == 3
    # Another model's tiers list nothing of this one's.
    assert store(DiskTier(tmp_path, 1 << 30), key=OTHER_MODEL).longest(prompt, SCOPE) is None


def test_a_state_is_wanted_only_for_what_it_adds_beyond_the_stored_entries(tmp_path):
    """A new question after a stored preamble, or a turn of a few tokens, is not stored again whole: only a state that
    adds min_tokens or more beyond the entry covering most of it (in its own scope) is worth a write."""
    s = store(DiskTier(tmp_path, 1 << 30), min_tokens=8)
    preamble = tokens(40)
    assert s.wants(preamble, SCOPE) and s.save(preamble, state(40), 40, SCOPE) and s.flush()
    assert not s.wants(preamble, SCOPE)  # held already
    assert not s.wants(tokens(30), SCOPE)  # a prefix of a stored entry: restored from it
    assert not s.wants(np.concatenate([preamble, tokens(7, start=900)]), SCOPE)  # 7 tokens more: prefilled
    assert s.wants(np.concatenate([preamble, tokens(8, start=900)]), SCOPE)  # 8 more: worth its own entry
    assert s.wants(preamble, OTHER_SCOPE)  # another key's entries cover nothing of this one's
    assert s.wants(tokens(40, start=1), SCOPE)  # differs at the first token
    s.close()


def test_truncated_corrupted_and_foreign_entries_are_refused_and_removed(tmp_path):
    s = store(DiskTier(tmp_path, 1 << 30))
    for i, n in enumerate((20, 30, 40)):
        s.save(tokens(n, start=1000 * i), state(64, i), 64, SCOPE)
    assert s.flush()
    payloads = sorted(tmp_path.rglob("*.kv"))
    records = {p.stem: p for p in payloads}
    first, second, third = (s.longest(tokens(n, start=1000 * i), SCOPE) for i, n in enumerate((20, 30, 40)))
    records[first.record.name].write_bytes(state(32))          # cut short
    data = bytearray(records[second.record.name].read_bytes())
    data[10] ^= 1
    records[second.record.name].write_bytes(bytes(data))        # one bit flipped
    assert s.fetch(first) is None and s.fetch(second) is None
    assert not records[first.record.name].exists() and not records[second.record.name].exists()
    assert s.longest(tokens(20), SCOPE) is None and s.stats()["tiers"]["disk"]["refused"] == 2
    assert s.fetch(third) == state(64, 2)
    # Another model's entry copied into this model's folder: its record names its own key, so it is never listed.
    other = index_record(OTHER_MODEL.digest(), SCOPE, tokens(50, start=5000), state(64))
    DiskTier(tmp_path, 1 << 30).write(other, state(64))
    folder = tmp_path / KEY.digest() / SCOPE
    for suffix in (".kv", ".idx"):
        (tmp_path / OTHER_MODEL.digest() / SCOPE / f"{other.name}{suffix}").rename(folder / f"{other.name}{suffix}")
    assert all(r.key == KEY.digest() for _, r in DiskTier(tmp_path, 1 << 30).scan(KEY.digest()))
    assert not (folder / f"{other.name}.idx").exists()


def test_the_disk_stays_within_its_bound_least_recently_used_out(tmp_path):
    s = store(DiskTier(tmp_path, 300))
    for i in range(3):
        s.save(tokens(20, start=100 * i), state(100, i), 100, SCOPE)
        assert s.flush()
    assert s.fetch(s.longest(tokens(20, start=0), SCOPE)) == state(100, 0)  # used: the most recent now
    os.utime(next(tmp_path.rglob(f"{s.longest(tokens(20, start=100), SCOPE).record.name}.kv")), (1, 1))
    s.save(tokens(20, start=300), state(100, 3), 100, SCOPE)
    assert s.flush()
    assert sum(p.stat().st_size for p in tmp_path.rglob("*.kv")) <= 300
    assert s.longest(tokens(20, start=100), SCOPE) is None  # the least recently used went
    assert s.longest(tokens(20, start=0), SCOPE) is not None
    assert s.stats()["tiers"]["disk"]["evicted"] == 1


def test_a_cluster_store_serves_a_replica_that_never_saw_the_prompt_and_fills_its_disk(tmp_path):
    shared = f"file://{tmp_path / 'store'}"
    first = store(DiskTier(tmp_path / "node-a", 1 << 30), StoreTier(shared))
    first.save(tokens(50), state(80, 4), 80, SCOPE)
    assert first.flush()
    second = store(DiskTier(tmp_path / "node-b", 1 << 30), StoreTier(shared))
    match = second.longest(tokens(60), SCOPE)
    assert (match.tier, match.shared) == ("cluster", 50)
    assert second.fetch(match) == state(80, 4)
    assert second.flush()
    assert second.longest(tokens(60), SCOPE).tier == "disk"  # copied to the nearer tier
    assert len(list((tmp_path / "store").rglob("*.kv"))) == 1 and not list((tmp_path / "store").rglob("*.tmp"))


def test_replicas_writing_the_same_entry_at_once_leave_one_good_copy(tmp_path):
    tiers = [DiskTier(tmp_path / "disk", 1 << 30), StoreTier(f"file://{tmp_path / 'store'}")]
    record = index_record(KEY.digest(), SCOPE, tokens(64), state(1 << 16, 9))
    errors = []

    def write(tier):
        try:
            for _ in range(20):
                tier.write(record, state(1 << 16, 9))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    for tier in tiers:
        threads = [threading.Thread(target=write, args=(tier,)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        [(_, found)] = list(tier.scan(KEY.digest()))
        assert tier.read(found) == state(1 << 16, 9)
    assert not errors
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]


class FullDisk(DiskTier):
    """A disk with no space left (or mounted read-only): every write fails as the kernel says so."""

    def write(self, record, payload):
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_or_read_only_disk_is_set_aside_and_nothing_fails(tmp_path):
    s = store(FullDisk(tmp_path, 1 << 30))
    assert s.save(tokens(40), state(64), 64, SCOPE)
    assert s.flush()
    tiers = s.stats()["tiers"]
    assert tiers["disk"]["errors"] == 1 and not tiers["disk"]["up"] and tiers["disk"]["entries"] == 0
    assert s.longest(tokens(40), SCOPE) is None


class BrokenStore(StoreTier):
    """A store whose every call fails (a network partition)."""

    def scan(self, key, known=frozenset()):
        raise ConnectionError("store unreachable")

    def write(self, record, payload):
        raise ConnectionError("store unreachable")


def test_an_unreachable_store_leaves_the_disk_serving(tmp_path, caplog):
    s = store(DiskTier(tmp_path / "disk", 1 << 30), BrokenStore(f"file://{tmp_path / 'store'}"))
    assert s.save(tokens(40), state(64), 64, SCOPE)
    assert s.flush()
    tiers = s.stats()["tiers"]
    assert tiers["cluster"]["errors"] >= 1 and not tiers["cluster"]["up"]
    assert tiers["disk"]["saves"] == 1 and s.longest(tokens(40), SCOPE).tier == "disk"
    assert sum("cluster tier set aside" in r.getMessage() for r in caplog.records) == 1  # once an episode


def test_a_full_queue_drops_saves_instead_of_holding_memory(tmp_path):
    s = TieredStore([DiskTier(tmp_path, 1 << 30)], lambda: KEY, min_tokens=8, max_queued_bytes=100)
    s.key = KEY.digest()  # on, but its writer not started: nothing leaves the queue
    assert s.save(tokens(10), state(80), 80, SCOPE)
    assert not s.save(tokens(10, start=50), state(80), 80, SCOPE) and s.dropped == 1


def test_a_files_checksum_is_read_once_per_version(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"weights" * 1000)
    cache = tmp_path / "cache"
    first = file_sha256(str(path), str(cache))
    assert len(first) == 64 and list((cache / "identities").iterdir())
    path.write_bytes(b"other weights" * 1000)  # another version (size, mtime)
    assert file_sha256(str(path), str(cache)) != first


def test_a_rescan_reads_only_new_records_and_forgets_removed_ones(tmp_path, monkeypatch):
    shared = StoreTier(f"file://{tmp_path / 'store'}")
    s = store(shared)
    s.save(tokens(40), state(64, 1), 64, SCOPE)
    assert s.flush()
    other = StoreTier(f"file://{tmp_path / 'store'}")  # another replica writes one more
    other.write(index_record(KEY.digest(), SCOPE, tokens(40, start=500), state(64, 2)), state(64, 2))
    reads = []
    real = shared.fs.cat_file
    monkeypatch.setattr(shared.fs, "cat_file", lambda path, *a, **k: (reads.append(path), real(path, *a, **k))[1])
    s._scan(s._tiers[0])
    assert len(reads) == 1 and reads[0].endswith(".idx")  # the new record only
    assert s.longest(tokens(40, start=500), SCOPE) is not None
    first = s.longest(tokens(40), SCOPE).record
    shared.remove(first)  # gone from the store (another replica found it corrupted, say)
    s._scan(s._tiers[0])
    assert s.longest(tokens(40), SCOPE) is None
