"""The KV a replica prefilled, kept beyond the replica: the node's disk (a bounded directory) and a store the
cluster shares (an fsspec URL), each entry one sequence's llama.cpp state with the tokens it holds, keyed by
everything that makes it valid (entry.py, key.py) and verified token by token and by checksum before it is used.

Plain files and bytes: the engine (app/engine/kv_placement.py) serializes and restores the KV; this package
finds, reads, writes, verifies and evicts entries, off the decode thread (tiers.py).

Why our own and not LMCache (the KV store of vLLM and Ray Serve LLM): LMCache keeps vLLM's paged KV blocks and
hooks vLLM's model runner to move them; llama.cpp gives one sequence's whole state as a blob
(llama_state_seq_get_data), which needs no block layout, only a key, a checksum and a place: fsspec already
writes it to a folder, S3 or GCS. Measured with that blob (python -m bench.kvcache): a cold replica restores a
3,527-token preamble from disk in 0.21 s where prefilling it takes 14.7 s on 2 cores."""
