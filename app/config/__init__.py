"""Build-time configuration: the serve application's args, and each model resolved into a ModelSpec (GGUF
metadata, chat template). The checks a model passes before the app is built are app/prompt/preflight.py."""
