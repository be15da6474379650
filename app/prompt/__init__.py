"""From messages to a prompt: the sandboxed chat template, content marks and the check after rendering, how
tools reach the prompt, and the checks a model's template passes before the app is built (preflight.py)."""
