"""The LoRA engine: a pure library (no graph, ComfyUI or HTTP imports).

Every LoRA file format converts into one canonical representation (``loaders.lora``); one module per model
family under ``loaders.families`` holds its key maps and sampling contracts; ``loaders.binding.patching`` fuses and
restores weights exactly; ``loaders.binding.peft_adapters`` manages dynamic adapters; ``loaders.binding`` brings a
shared model to the state a handle (``loaders.handles``) asks for.
"""
