"""Tenants: key policies (limits, budgets, allowed models, priority), the ledger that counts them for the whole
cluster, and the headers that report them."""
