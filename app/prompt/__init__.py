"""From messages to a prompt: the sandboxed chat template, content marks and the check after rendering, how
tools reach the prompt, and /tokenize over the same rendering."""
