"""Single-file checkpoints as ComfyUI users have them: native key layouts, detection, fp8, tokenizers, loading.

ComfyUI keeps denoisers in ``models/diffusion_models`` (also ``unet``), VAEs in ``models/vae`` and text encoders
in ``models/text_encoders`` (also ``clip``), one ``.safetensors`` file each, in the original (native) key
names, in bf16/fp16, ``fp8_e4m3fn`` or fp8 scaled. This package maps those files onto the diffusers modules the
rest of lorabind uses.
"""
