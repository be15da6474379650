"""A model's replica getting its files ready before its engine loads: what the builder left remote fetched
into the node's cache and checked (local_copy.py), in a background thread whose state /health reports
(preparation.py). Where the files come from is app/model_sources/."""
