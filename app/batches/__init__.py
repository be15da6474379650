"""Batch jobs: OpenAI's Files and Batches API and Anthropic's Message Batches over one machinery. Files and batch
state live in a store (store.py: an fsspec URL, a local directory by default); a batch's lines are checked
(validation.py), then run by the runner (runner.py) through the same processing an HTTP request reaches, at the
lowest priority, their results written in atomic chunks so each line is answered once across restarts. The
routes' side (service.py) answers the protocols' JSON; the HTTP edge streams uploads and downloads itself."""
