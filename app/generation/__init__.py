"""What every protocol's service shares, below them all: the caller's identity (caller.py), the generation core
(core.py) that chat completions, Responses and Messages adapt to: planning a chat-shaped request into a
generation (plan.py: prompt, sampling, grammar, limits, how to read the reply; images.py: its image parts
checked and loaded), running its rounds and choices (rounds.py, choices.py, tally.py) and reading the reply
into neutral events and results (reading.py); and a request's lifecycle (lifecycle.py: planned off the event
loop, run, recorded once; a pooled pass for embeddings and rerank)."""
