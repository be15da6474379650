"""Where a model's GGUF comes from (a path, a package, the Hugging Face Hub, a bucket, a URL), how the
builder reads its header without the file, and how each node fetches it once into its own cache."""
