"""Model pools: replicas that load many GGUFs on demand, least recently used evicted (issue 38)."""
