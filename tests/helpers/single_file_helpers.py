"""Shared by the single-file tests: a tiny models root with the single files, and a graph run on node classes."""

import torch

from lorabind.nodes import NODE_CLASS_MAPPINGS

SAMPLER = {"seed": 42, "steps": 3, "cfg": 3.0, "shift": 5.0, "boundary": 0.0, "enforce_contract": True,
           "cfg_low_noise": 0.0}


def call(node: str, **inputs):
    cls = NODE_CLASS_MAPPINGS[node]
    return getattr(cls(), cls.FUNCTION)(**inputs)


def render(model, *, frames: int, prompt: str = "a cat dancing on the street") -> torch.Tensor:
    """The main workflow's chain on the node classes: encode, empty latent, sample, decode -> IMAGE."""
    (positive,) = call("LoraBindTextEncode", model=model, text=prompt)
    (negative,) = call("LoraBindTextEncode", model=model, text="blurry, low quality")
    (latent,) = call("LoraBindEmptyLatent", model=model, width=32, height=32, frames=frames, batch_size=1)
    sampled = call("LoraBindSampler", model=model, positive=positive, negative=negative, latent=latent, **SAMPLER)
    (images,) = call("LoraBindVAEDecode", model=model, latent=sampled["result"][0])
    return images
