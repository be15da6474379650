"""What every protocol's service shares, below them all: the caller's identity (caller.py), planning a
chat-shaped request into a generation (plan.py: prompt, sampling, grammar, limits, how to read the reply;
images.py: its image parts checked and loaded), and a request's lifecycle (lifecycle.py: planned off the
event loop, run, recorded once; a pooled pass for embeddings and rerank)."""
