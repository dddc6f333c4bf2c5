"""The step engine: several served requests' denoising steps run as one batched forward (``engine``)."""
