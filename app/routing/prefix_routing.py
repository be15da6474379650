"""Prefix-aware choice of a model replica, as plain data (no Ray): which replica most likely still holds
the KV of the longest prefix of a prompt, and when load matters more than that.

Each model replica keeps the KV of recent prompts in its slots, and a new prompt reuses the longest
common token prefix any slot holds (app/engine/engine.py `_place`). A router that sends the next turn
of a conversation, or the next request with the same long system prompt, to the replica that served
the last one lets that replica skip the prefix's prefill.

What a replica holds is not asked of it: the router remembers what it sent where. A prompt's text is
cut into blocks of `block_chars` characters, each block's hash chained to the one before it, so a
block hash stands for the whole prefix up to it. A replica's record is a bounded LRU set of such
hashes; the prefix a replica holds of a new prompt is the run of its leading block hashes found in
the record. Characters, not tokens: the rendered prompt is what the router has in hand (tokenizing
there would cost more than the choice is worth), and a common character prefix is a common token
prefix up to the last token or two.

The record is an estimate: a replica's slots hold about `n_seq_max` prompts and overwrite them as new
ones come, so the bound (`max_chars` per replica) should be about what its slots can hold
(`n_seq_max * n_ctx` tokens at a few characters a token). A wrong guess costs a cache miss, never a
wrong answer.

Beyond a replica's memory, a model keeps prefilled states on its node's disk (app/kvstore), which every
replica on that node restores from, the replica that saved them gone or not. With `node_chars` set (the
builder sets it where the model has a disk tier), the router keeps a second record per node, of the prompts
sent to any replica there: when no replica holds a prompt's prefix in memory (its replica died, or is busy),
a replica on a node whose disk holds it restores it instead of prefilling, and is preferred over one on a
node that does not, as long as it is not busy. On one node every replica has the same disk and the record
changes nothing.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Prefixes shorter than this are not worth a less loaded replica: every chat prompt starts with its
# template's fixed header (e.g. a default system line), and recomputing a few dozen tokens is cheap.
DEFAULT_MIN_MATCH_CHARS = 256
DEFAULT_BLOCK_CHARS = 64
DEFAULT_MAX_CHARS = 1 << 20
# About how many characters one token of English text spans (for the records' default bound).
CHARS_PER_TOKEN = 4


# The settings a deployment's request_router_kwargs may give PrefixRouter.
ROUTER_KWARGS = frozenset({"block_chars", "max_chars", "min_match_chars", "imbalance", "node_chars"})
# A node's record against one replica's: a node's disk keeps the states of all its replicas, and keeps them
# longer than their slots do (bounded by `kv_cache.disk_mib`, whose tokens the builder cannot count without
# the GGUF's shapes; an overestimate costs a restore that finds nothing and prefills, as a cache miss does).
NODE_RECORD_FACTOR = 8
VACANT_NODE_RECORDS = 16


def block_hashes(text: str, block_chars: int = DEFAULT_BLOCK_CHARS, scope: str = "") -> list[int]:
    """Chained hashes of `text`'s whole blocks: the i-th stands for text[: (i + 1) * block_chars].
    A trailing partial block is left out. The chain starts from the prompt's cache scope, so prompts
    of two scopes never match: a replica holds a prefix for its own scope only (the engine reuses KV
    within a scope). Python's str hash is salted per process, which is fine: a record lives and is
    read in one process."""
    out: list[int] = []
    h = hash(("scope", scope))
    for start in range(0, len(text) - block_chars + 1, block_chars):
        h = hash((h, text[start:start + block_chars]))
        out.append(h)
    return out


class PrefixRecord:
    """The prefixes sent to one replica: a set of chained block hashes, least recently used first
    out once it holds `max_blocks`."""

    def __init__(self, max_blocks: int) -> None:
        if max_blocks < 1:
            raise ValueError("max_blocks must be at least 1")
        self.max_blocks = max_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def match(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of a prompt (its `block_hashes`) this replica was sent."""
        n = 0
        for h in hashes:
            if h not in self._blocks:
                break
            n += 1
        return n

    def add(self, hashes: Sequence[int]) -> None:
        # Touched last block first, so a prompt's head is its most recently used part and is evicted
        # last: a record never keeps a tail whose head it has lost (the match walks from the head).
        for h in reversed(hashes):
            self._blocks[h] = None
            self._blocks.move_to_end(h)
        while len(self._blocks) > self.max_blocks:
            self._blocks.popitem(last=False)


@dataclass(frozen=True)
class ReplicaLoad:
    """What the caller knows of a replica's load: requests it runs now (None: not known) and the
    most it takes (its max_ongoing_requests)."""

    ongoing: int | None
    capacity: int


@dataclass(frozen=True)
class Choice:
    """A routing decision: `order` is every replica, best first (`order[0]` is the choice);
    `reason` is `prefix` (the replica holding the longest prefix), `load` (no prefix worth it: the
    least loaded) or `busy` (the replica with the prefix is too loaded: the least loaded instead);
    `node` (no replica holds the prefix in memory, or the one holding it is busy: a replica whose node's disk
    holds it, which restores it); `matched_chars` is the prefix the chosen replica holds, in memory or on its
    node's disk, as far as the router knows."""

    order: list[Hashable]
    reason: str
    matched_chars: int

    @property
    def replica(self) -> Hashable:
        return self.order[0]


class PrefixRouter:
    """Per-replica prefix records and the choice made from them.

    - The replica holding the longest known prefix of the prompt (at least `min_match_chars`) is
      chosen, unless it is busy: full (ongoing >= capacity) or running `imbalance` or more requests
      above the least loaded replica (default: half its capacity, at least 2).
    - Otherwise (no such prefix, or busy) the least loaded replica; ties go to the longer prefix,
      then to the smaller record (a replica with less cached spreads new prefixes), then at random.
    - Before falling back to load, with node records on (`node_chars` > 0) and where the nodes' disks differ: the
      least loaded replica whose node's disk holds the longest prefix (at least `min_match_chars`, longer than
      the least loaded replica holds in memory), unless it is busy.
    - Replicas with an unknown load count as idle (the caller should ask them first when it can).
    """

    def __init__(self, *, block_chars: int = DEFAULT_BLOCK_CHARS, max_chars: int = DEFAULT_MAX_CHARS,
                 min_match_chars: int = DEFAULT_MIN_MATCH_CHARS, imbalance: int | None = None,
                 node_chars: int = 0, rng: random.Random | None = None) -> None:
        if block_chars < 1:
            raise ValueError("block_chars must be at least 1")
        if imbalance is not None and imbalance < 1:
            raise ValueError("imbalance must be at least 1")
        if node_chars < 0:
            raise ValueError("node_chars must be 0 (no node records) or more")
        self.block_chars = block_chars
        self.max_blocks = max(1, max_chars // block_chars)
        self.min_match_chars = min_match_chars
        self.imbalance = imbalance
        self.rng = rng or random.Random()
        self.records: dict[Hashable, PrefixRecord] = {}
        # 0 (node_chars below one block): no node records. Otherwise each node's record, kept while its replicas come
        # and go (the disk stays).
        self.node_blocks = node_chars // block_chars
        self.node_records: OrderedDict[Hashable, PrefixRecord] = OrderedDict()
        self.node_of: dict[Hashable, Hashable] = {}

    # -- records ---------------------------------------------------------------------------------
    def record_of(self, replica: Hashable) -> PrefixRecord:
        rec = self.records.get(replica)
        if rec is None:
            rec = self.records[replica] = PrefixRecord(self.max_blocks)
        return rec

    def record(self, prompt: str, replica: Hashable, scope: str = "") -> None:
        """`prompt` (of cache scope `scope`) was sent to `replica` (call it once the replica accepted
        the request)."""
        hashes = block_hashes(prompt, self.block_chars, scope)
        self.record_of(replica).add(hashes)
        node = self.node_of.get(replica)
        if self.node_blocks and node is not None:
            rec = self.node_records.get(node)
            if rec is None:
                rec = self.node_records[node] = PrefixRecord(self.node_blocks)
            rec.add(hashes)

    def sync(self, replicas: Iterable[Hashable], nodes: Mapping[Hashable, Hashable | None] | None = None) -> None:
        """The live replicas are `replicas` (`nodes`: the node each runs on, where known): new ones get an empty
        record, vanished ones are forgotten. Node records stay: the node's disk keeps what they stand for."""
        live = set(replicas)
        for gone in [r for r in self.records if r not in live]:
            del self.records[gone]
        for r in live:
            self.record_of(r)
        self.node_of = {r: n for r, n in (nodes or {}).items() if r in live and n is not None}
        # A node none of the replicas runs on keeps its record (a replica placed there later restores from its
        # disk) among the VACANT_NODE_RECORDS most recently vacated: nodes come and go on an autoscaled cluster.
        occupied = set(self.node_of.values())
        for node in occupied & self.node_records.keys():
            self.node_records.move_to_end(node)
        vacant = [n for n in self.node_records if n not in occupied]
        for node in vacant[:max(0, len(vacant) - VACANT_NODE_RECORDS)]:
            del self.node_records[node]

    def forget(self, replica: Hashable) -> None:
        self.records.pop(replica, None)
        self.node_of.pop(replica, None)

    def node_matched_chars(self, prompt: str, replica: Hashable, scope: str = "") -> int:
        """The prefix of `prompt` the disk of `replica`'s node holds, as far as the router knows."""
        return self._node_match(block_hashes(prompt, self.block_chars, scope), replica)

    def _node_match(self, hashes: Sequence[int], replica: Hashable) -> int:
        rec = self.node_records.get(self.node_of.get(replica))
        return rec.match(hashes) * self.block_chars if rec else 0

    def matched_chars(self, prompt: str, replica: Hashable, scope: str = "") -> int:
        rec = self.records.get(replica)
        return rec.match(block_hashes(prompt, self.block_chars, scope)) * self.block_chars if rec else 0

    # -- the choice ------------------------------------------------------------------------------
    def _busy(self, load: ReplicaLoad, least: int) -> bool:
        ongoing = load.ongoing or 0
        if ongoing >= load.capacity:
            return True
        threshold = self.imbalance if self.imbalance is not None else max(2, load.capacity // 2)
        return ongoing - least >= threshold

    def choose(self, prompt: str, loads: Mapping[Hashable, ReplicaLoad], scope: str = "") -> Choice:
        """Where to send `prompt` (of cache scope `scope`), among the replicas of `loads` (at least one)."""
        if not loads:
            raise ValueError("no replica to choose from")
        hashes = block_hashes(prompt, self.block_chars, scope)
        matched = {}
        for r in loads:
            rec = self.records.get(r)
            matched[r] = rec.match(hashes) * self.block_chars if rec else 0
        ongoing = {r: (load.ongoing or 0) for r, load in loads.items()}
        size = {r: len(self.records[r]) if r in self.records else 0 for r in loads}
        jitter = {r: self.rng.random() for r in loads}
        # A full replica is never "least loaded" while another has room.
        open_ = [r for r, load in loads.items() if ongoing[r] < load.capacity] or list(loads)
        least = min(ongoing[r] for r in open_)

        by_prefix = max(loads, key=lambda r: (matched[r], -ongoing[r], -size[r], jitter[r]))
        by_load = sorted(loads, key=lambda r: (ongoing[r] >= loads[r].capacity, ongoing[r], -matched[r],
                                               size[r], jitter[r]))
        held = matched[by_prefix] >= self.min_match_chars and matched[by_prefix] > 0
        if held and not self._busy(loads[by_prefix], least):
            rest = [r for r in by_load if r != by_prefix]
            return Choice([by_prefix, *rest], "prefix", matched[by_prefix])
        if self.node_blocks:
            on_disk = {r: self._node_match(hashes, r) for r in loads}
            by_node = max(loads, key=lambda r: (on_disk[r], -ongoing[r], -size[r], jitter[r]))
            best = on_disk[by_node]
            # Only where nodes differ (on one node every replica restores it alike), and where the least loaded
            # replica does not hold as much in memory.
            if (best >= self.min_match_chars and best > min(on_disk.values()) and best > matched[by_load[0]]
                    and not self._busy(loads[by_node], least)):
                rest = [r for r in by_load if r != by_node]
                return Choice([by_node, *rest], "node", best)
        return Choice(by_load, "busy" if held else "load", matched[by_load[0]])


def max_chars_for(n_seq_max: int, n_ctx: int) -> int:
    """A record bound matching what one replica's slots hold: `n_seq_max` sequences of `n_ctx` tokens."""
    return n_seq_max * n_ctx * CHARS_PER_TOKEN


def router_kwargs_problem(kwargs: Mapping[str, Any]) -> str | None:
    """What is wrong with a deployment's request_router_kwargs for PrefixRouter (None: they make one)."""
    for key, value in kwargs.items():
        if key == "imbalance" and value is None:  # None: the default, half a replica's capacity
            continue
        if key in ROUTER_KWARGS and (not isinstance(value, int) or isinstance(value, bool)):
            return f"{key} must be an integer, not {value!r}"
    try:
        PrefixRouter(**{k: v for k, v in kwargs.items() if k in ROUTER_KWARGS})
    except (TypeError, ValueError) as e:
        return str(e)
    return None


def router_kwargs(n_seq_max: int, n_ctx: int, disk_tier: bool) -> dict[str, int]:
    """The builder's settings of a model's (or pool's) router: records bounded by what one replica's slots hold,
    and node records where the model keeps states on its nodes' disks."""
    max_chars = max_chars_for(n_seq_max, n_ctx)
    return {"max_chars": max_chars, **({"node_chars": max_chars * NODE_RECORD_FACTOR} if disk_tier else {})}
