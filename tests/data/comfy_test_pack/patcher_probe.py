"""Test-only probe (never shipped): what ComfyUI's own patcher makes of a LoRA, on ComfyUI's own model class.

``LoraBindTestPatcherProbe`` builds ComfyUI's model from a tiny single file the way ``UNETLoader`` does (its
detection, its model class, its weight loading), except for the sizes ComfyUI fixes instead of reading them from
the file (Wan: head count = width / 128, text width 4096, CLIP image width 1280; Qwen-Image: everything but the
input width and depth): those come in as ``config`` overrides, and a parameter still shaped otherwise than the file
is re-made at the file's shape (listed in the output: no forward pass runs, only the patcher). Then:
- ``LoraBindLoRA`` (or the node named by ``node``: ``LoraBindPEFTAdapter``), from ComfyUI's node registry, patches a clone, ComfyUI's patcher loads it, and every weight of
  the patched model is written in float32 to ``<output>/<out_name>.safetensors`` for the test to compare;
- ComfyUI's own ``LoraLoaderModelOnly`` loads the same file, and the keys it leaves unapplied (its "lora key not
  loaded" warnings) are counted.
"""

import json
import logging
import os

import torch


class _NotLoaded(logging.Handler):
    """Collects the keys of ComfyUI's "lora key not loaded: KEY" warnings."""

    PREFIX = "lora key not loaded: "

    def __init__(self):
        super().__init__(logging.WARNING)
        self.keys = []

    def emit(self, record):
        message = record.getMessage()
        if message.startswith(self.PREFIX):
            self.keys.append(message[len(self.PREFIX):])


def _comfy_model(path, overrides, dtype):
    """ComfyUI's ModelPatcher for the denoiser file, as comfy.sd.load_diffusion_model_state_dict builds it, with
    ``overrides`` applied to the detected config; returns (patcher, keys re-made at the file's shape)."""
    import comfy.model_management as mm
    import comfy.model_patcher
    import comfy.utils
    from comfy import model_detection

    sd = comfy.utils.load_torch_file(path)
    prefix = model_detection.unet_prefix_from_state_dict(sd)
    sd = comfy.utils.state_dict_prefix_replace(sd, {prefix: ""}, filter_keys=True) or sd
    model_config = model_detection.model_config_from_unet(sd, "")
    model_config.unet_config.update(overrides)
    model_config.set_inference_dtype(dtype, None)
    model = model_config.get_model(sd, "")
    remade = _fit_shapes(model.diffusion_model, sd, dtype)
    model.load_model_weights(sd, "")
    device = mm.get_torch_device()
    return comfy.model_patcher.ModelPatcher(model, load_device=device, offload_device=device), remade


def _fit_shapes(module, sd, dtype):
    remade = []
    for key, value in module.state_dict().items():
        wanted = sd.get(key)
        if wanted is not None and tuple(wanted.shape) != tuple(value.shape):
            owner_path, _, name = key.rpartition(".")
            owner = module.get_submodule(owner_path)
            owner.register_parameter(name, torch.nn.Parameter(torch.empty(wanted.shape, dtype=dtype),
                                                              requires_grad=False))
            remade.append(key)
    return remade


def _patched_weights(patcher):
    patcher.patch_model(device_to=patcher.load_device)
    try:
        return {key: value.detach().float().cpu().clone()
                for key, value in patcher.model.diffusion_model.state_dict().items()}
    finally:
        patcher.unpatch_model(device_to=patcher.offload_device)


def _streamed(patcher, weights):
    """One weight patch the way ComfyUI applies it while streaming weights (its low-VRAM patch; in 0.30.0 also
    every patched weight under dynamic VRAM, whose prefetch first re-makes the adapter): the first patched key,
    handed over in the model's dtype. -> {key, dtype of the result, largest difference to the loaded value}."""
    import comfy.model_patcher
    import comfy.utils

    key = sorted(patcher.patches)[0]
    streaming = comfy.model_patcher.LowVramPatch(key, patcher.patches)
    if hasattr(streaming, "prepare"):  # 0.30.0: what dynamic VRAM's cast does before it calls the patch
        streaming.memory_required()
        streaming.prepare(None, None, copy=False, commit=True)
    value = streaming(comfy.utils.get_attr(patcher.model, key).detach().clone())
    loaded = weights[key.removeprefix("diffusion_model.")]
    return {"key": key, "dtype": str(value.dtype), "max_diff": float((value.float() - loaded).abs().max()),
            "max_abs": float(loaded.abs().max())}


class LoraBindTestPatcherProbe:
    CATEGORY = "lorabind-test"
    FUNCTION = "probe"
    OUTPUT_NODE = True
    RETURN_TYPES = ()

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"denoiser": ("STRING", {"default": ""}), "lora_name": ("STRING", {"default": ""}),
                             "strength": ("FLOAT", {"default": 1.0, "min": -10.0, "max": 10.0}),
                             "lenient": ("BOOLEAN", {"default": False}),
                             "config": ("STRING", {"default": "{}"}), "out_name": ("STRING", {"default": ""}),
                             "node": ("STRING", {"default": "LoraBindLoRA"})}}

    def probe(self, denoiser, lora_name, strength, lenient, config, out_name, node="LoraBindLoRA"):
        import folder_paths
        from safetensors.torch import save_file

        import nodes

        base, remade = _comfy_model(folder_paths.get_full_path_or_raise("diffusion_models", denoiser),
                                    json.loads(config), torch.bfloat16)
        ours = nodes.NODE_CLASS_MAPPINGS[node]().apply(base, lora_name, strength, lenient, False)
        weights = _patched_weights(ours["result"][0])
        streamed = _streamed(ours["result"][0], weights) if ours["result"][0].patches else None
        save_file(weights, os.path.join(folder_paths.get_output_directory(), f"{out_name}.safetensors"))
        not_loaded = _NotLoaded()
        logging.getLogger().addHandler(not_loaded)
        try:
            comfy_file = lora_name if os.path.isfile(folder_paths.get_full_path("loras", lora_name) or "") else \
                f"{lora_name}/adapter_model.safetensors"
            theirs = nodes.LoraLoaderModelOnly().load_lora_model_only(base, comfy_file, strength)[0]
        finally:
            logging.getLogger().removeHandler(not_loaded)
        report = {"accounting": ours["ui"]["lorabind_accounting"][0], "remade": remade, "text": ours["ui"]["text"],
                  "comfy_not_loaded": not_loaded.keys, "comfy_patched": len(theirs.patches),
                  "streamed": streamed, "ref_method": getattr(base.model.diffusion_model, "default_ref_method", None),
                  "ours_patched": len(ours["result"][0].patches) + len(ours["result"][0].object_patches), "dtype": str(base.model.get_dtype())}
        return {"ui": {"probe": [report]}}


NODE_CLASS_MAPPINGS = {"LoraBindTestPatcherProbe": LoraBindTestPatcherProbe}
