"""File io of the engine: atomic writes, safe outputs, images, WAVs and JSON limits."""
