"""What the HTTP layer talks to, whatever the topology: the processing (prompts in, replies out) and the
models (generation streams, tokenizers, their state), as typed interfaces with one plain implementation
each here and their Ray wiring in deployments/."""
