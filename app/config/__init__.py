"""Build-time configuration: the serve application's args, each model resolved into a ModelSpec (GGUF metadata,
chat template), and the checks a model must pass before the app is built."""
