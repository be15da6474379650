"""Which model replica serves a prompt: the prefix-aware choice, without Ray (deployments/prefix_router.py wraps it)."""
