"""Model pools: replicas that load many GGUFs on demand, the idle model least in demand evicted (issue 38)."""
