"""The component roles of a model family: which part of a loaded model plays which part in a run.

The vocabulary every family's layout answers in (``FamilyLayout.denoiser_roles`` / ``components``) and
``loaders.placement`` plans with. A leaf: the family interface and its parts both speak it.
"""

from __future__ import annotations

# Component roles (``FamilyLayout.denoiser_roles`` / ``components``), the vocabulary ``loaders.placement`` plans with.
ROLE_DENOISER = "denoiser"  # a model's only denoiser, or one chosen by the task (MiniMax-H3 partitions)
ROLE_HIGH_NOISE = "high_noise_expert"  # Wan2.2 MoE: runs while sigma >= boundary (``transformer``)
ROLE_LOW_NOISE = "low_noise_expert"  # Wan2.2 MoE: runs below the boundary (``transformer_2``)
ROLE_TEXT_ENCODER = "text_encoder"
ROLE_IMAGE_ENCODER = "image_encoder"
ROLE_VAE = "vae"  # video and audio VAEs alike
# A denoiser that only other tasks use (MiniMax-H3's ``transformer_ref`` serves Ref2VA only): a run loads it
# instead of the main one, never next to it, so a plan sizes the run by the main one.
ROLE_ALTERNATE = "alternate_denoiser"
DENOISER_ROLES = (ROLE_DENOISER, ROLE_HIGH_NOISE, ROLE_LOW_NOISE)

# The components most diffusers pipelines name the same way (each family's ``index_roles`` starts from these).
SHARED_INDEX_ROLES = {"text_encoder": ROLE_TEXT_ENCODER, "image_encoder": ROLE_IMAGE_ENCODER, "vae": ROLE_VAE}
