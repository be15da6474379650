"""Images in requests: read from a data URL (or fetched, where the config allows), then checked and decoded
by Pillow into the RGB pixels a model's projector takes (app/engine/params.py ImageInput)."""

from .load import load_image, load_images

__all__ = ["load_image", "load_images"]
