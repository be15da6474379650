"""The KV a replica prefilled, kept beyond the replica: the node's disk (a bounded directory) and a store the
cluster shares (an fsspec URL), each entry one sequence's llama.cpp state with the tokens it holds, keyed by
everything that makes it valid (entry.py, key.py) and verified token by token and by checksum before it is used.

Plain files and bytes: the engine (app/engine/kv_placement.py) serializes and restores the KV; this package
finds, reads, writes, verifies and evicts entries, off the decode thread (tiers.py)."""
