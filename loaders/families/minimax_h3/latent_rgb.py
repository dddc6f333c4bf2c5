"""The latent->RGB map of the MiniMax-H3 video VAE (24 channels), for live previews.

The numbers are a fact of that VAE's normalised latent space (the sampler's video latent): the linear fit ComfyUI
0.30 publishes for the same space as ``comfy.latent_formats.MiniMaxH3Video`` (older ComfyUI has no such class, and
there our map is handed to its previewer instead). The soundtrack has no picture: previews show the video.
"""

from __future__ import annotations

from ...generation.latent_rgb import LatentRGB

MINIMAX_H3_VIDEO_RGB = LatentRGB(
    factors=(
        (-0.018555, 0.024344, -0.017536), (0.150164, 0.137244, 0.129221), (0.027367, -0.050369, -0.208606),
        (-0.000793, -0.164622, -0.323161), (-0.048556, 0.01397, -0.074286), (0.01174, 0.014172, -0.006906),
        (0.061517, 0.061212, 0.110025), (0.035321, 0.086879, 0.110059), (-0.017426, 0.002997, 0.035356),
        (0.531539, 0.548819, 0.624404), (-0.024968, -0.040234, -0.034302), (-0.032549, -0.029096, -0.017221),
        (0.022609, 0.020286, 0.050661), (-0.084001, -0.038131, -0.020805), (-0.01883, 0.010412, 0.06112),
        (0.020777, 0.011196, -0.030994), (-0.00839, -0.012201, -0.025687), (-0.013281, -0.002924, 0.006331),
        (0.00026, 0.001833, -0.011038), (0.105471, 0.100482, 0.132106), (0.016529, 0.015213, 0.009999),
        (-0.014015, -0.017438, -0.019134), (-0.033787, -0.009984, -0.019725), (0.004224, 0.017284, 0.027196),
    ),
    bias=(0.057426, -0.022078, -0.071449),
    comfy_format="MiniMaxH3Video",
)
