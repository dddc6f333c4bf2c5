"""File io of the engine: atomic writes, safe outputs, images, WAVs, videos and JSON limits."""
