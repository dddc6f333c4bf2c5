"""A toy model family defined entirely outside the pack: its modules, its folder builder and its family object.

It exists to show that a family is one package behind ``ModelFamily``: nothing in the engine, the use cases, the
planner or the single-file loader knows its names. Its denoiser is called ``backbone`` (not ``transformer*``), its
LoRA names are its own (``mixers.N``), its single files have their own key layout (``blocks.N.mix``), kinds,
configurations (``toy_configs/``) and tokenizer, and it reaches the engine through one line:
``families.register(FAMILY)``.

The components are small diffusers ``ModelMixin`` classes so a folder of them saves and loads like any diffusers
folder (``model_index.json`` names this module as their library, which the memory planner imports to size them).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Optional

import torch
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config

from lorabind.loaders.families.diffusers_flow import DiffusersFlowSampling, OneScheduleContracts, check_multiple
from lorabind.loaders.families.interface import SOURCE_DIFFUSERS, ModelFamily, PipelineSource
from lorabind.loaders.families.parts import FamilyLayout, KeyMap
from lorabind.loaders.families.roles import ROLE_DENOISER, ROLE_TEXT_ENCODER, ROLE_VAE
from lorabind.loaders.generation.sampling import device_and_dtype
from lorabind.loaders.handles import ConditioningHandle, LatentHandle
from lorabind.loaders.io.key_layouts import KeyLayout
from lorabind.loaders.io.single_file_kinds import ComponentKind, KnownModel, count_indices
from lorabind.loaders.lora.canonical import LoraFile

LIBRARY = __name__  # what model_index.json names as the components' library
PIPELINE_CLASS = "ToyPipeline"
DENOISER = "backbone"
CHANNELS, TEXT_DIM, VOCAB, HIDDEN = 4, 8, 64, 32  # HIDDEN: whole Q8_0 blocks, so a GGUF file keeps mixers quantized
CONFIGS = Path(__file__).with_name("toy_configs")
_TARGET = re.compile(r"mixers\.\d+|inp|ctx|out")  # the denoiser modules a LoRA may patch


class ToyDenoiser(ModelMixin, ConfigMixin):
    """Velocity of a [B, C, H, W] latent at ``sigma`` given a [B, S, D] prompt embedding: per-pixel MLP."""

    _no_split_modules = ["Linear"]

    @register_to_config
    def __init__(self, out_channels: int = CHANNELS, text_dim: int = TEXT_DIM, hidden: int = HIDDEN, depth: int = 2):
        super().__init__()
        self.inp = torch.nn.Linear(out_channels, hidden)
        self.ctx = torch.nn.Linear(text_dim, hidden)
        self.mixers = torch.nn.ModuleList(torch.nn.Linear(hidden, hidden) for _ in range(depth))
        self.out = torch.nn.Linear(hidden, out_channels)

    def forward(self, x, sigma, context):
        batch, channels, height, width = x.shape
        tokens = x.permute(0, 2, 3, 1).reshape(batch, height * width, channels)
        h = self.inp(tokens) + self.ctx(context.mean(dim=1))[:, None] + sigma
        for mixer in self.mixers:
            h = h + torch.tanh(mixer(h))
        return self.out(h).reshape(batch, height, width, channels).permute(0, 3, 1, 2)


class ToyTextEncoder(ModelMixin, ConfigMixin):
    @register_to_config
    def __init__(self, vocab: int = VOCAB, d_model: int = TEXT_DIM):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d_model)

    def forward(self, ids):
        return self.embed(ids)


class ToyVAE(ModelMixin, ConfigMixin):
    """Decodes a latent to an image twice its size (1x1 conv to RGB, nearest upsampling)."""

    @register_to_config
    def __init__(self, z_dim: int = CHANNELS, scale: int = 2):
        super().__init__()
        self.to_rgb = torch.nn.Conv2d(z_dim, 3, 1)

    def decode(self, z):
        return torch.nn.functional.interpolate(torch.tanh(self.to_rgb(z)), scale_factor=self.config.scale)


_CLASSES = {DENOISER: ToyDenoiser, "text_encoder": ToyTextEncoder, "vae": ToyVAE}


class ToyTokenizer:
    """Byte-level ids below ``vocab``: what the toy text encoder reads (its single file names the vocabulary)."""

    def __init__(self, vocab: int = VOCAB):
        self.vocab = vocab

    def __call__(self, text: str):
        return torch.tensor([[byte % self.vocab for byte in text.encode("utf-8")] or [0]])


class ToyPipeline:
    """The family's pipeline object: its components by name (``components`` is what placement moves) and the
    index a folder of them holds (``config``: what ``pipeline_index`` reports for a single-file set)."""

    def __init__(self, components: dict, tokenizer: ToyTokenizer):
        self.components = dict(components)
        self.tokenizer = tokenizer
        self.config = {name: [LIBRARY, type(module).__name__] for name, module in components.items()}
        for name, module in components.items():
            setattr(self, name, module)

    def set_progress_bar_config(self, **_):
        """The loader silences library progress bars; this pipeline has none."""


def build_folder(folder: Path, seed: int = 0) -> Path:
    """A toy diffusers folder with random weights (safetensors) and its ``model_index.json``."""
    torch.manual_seed(seed)
    index = {"_class_name": PIPELINE_CLASS, "_diffusers_version": "0.0.0"}
    for name, cls in _CLASSES.items():
        cls().save_pretrained(folder / name, safe_serialization=True)
        index[name] = [LIBRARY, cls.__name__]
    (folder / "model_index.json").write_text(json.dumps(index, indent=2), encoding="utf-8")
    return folder


def _map_target(name: str) -> Optional[str]:
    return name if _TARGET.fullmatch(name) else None


def _recognizes(lora: LoraFile) -> bool:
    return any(name.startswith("mixers.") for name in lora.targets if _map_target(name))


# the native names of its single files: ``blocks.N.mix`` where the module says ``mixers.N``
BACKBONE_LAYOUT = KeyLayout("toy_backbone", (("mixers.{i}", "blocks.{i}.mix"),))
SAME_NAMES = KeyLayout("toy_same_names", ())
SINGLE_FILE_KINDS = (
    ComponentKind(kind="toy_backbone", role="denoiser", markers=("blocks.0.mix.weight", "inp.weight"),
                  library=LIBRARY, class_name="ToyDenoiser",
                  file_signature=lambda s: (s["inp.weight"][0], count_indices(s, r"blocks\.(\d+)\.")),
                  config_signature=lambda c: (c["hidden"], c["depth"]), layout=lambda c: BACKBONE_LAYOUT,
                  takes=("toy_vae", "toy_text"), gguf_architecture="toy"),
    ComponentKind(kind="toy_vae", role="vae", markers=("to_rgb.weight",), library=LIBRARY, class_name="ToyVAE",
                  file_signature=lambda s: (s["to_rgb.weight"][1],), config_signature=lambda c: (c["z_dim"],),
                  layout=lambda c: SAME_NAMES),
    ComponentKind(kind="toy_text", role="text_encoder", markers=("embed.weight",), library=LIBRARY,
                  class_name="ToyTextEncoder", file_signature=lambda s: tuple(s["embed.weight"]),
                  config_signature=lambda c: (c["vocab"], c["d_model"]), layout=lambda c: SAME_NAMES,
                  tokenizer=lambda encoder, folders: ToyTokenizer(encoder.config["vocab"])),
)
KNOWN_SINGLE_FILES = tuple(KnownModel(config=str(CONFIGS / f"{kind}.json"), kind=kind, title=title, size="toy")
                           for kind, title in (("toy_backbone", "Toy backbone"), ("toy_vae", "Toy VAE"),
                                               ("toy_text", "Toy text encoder")))


class ToyLayout(FamilyLayout):
    index_roles = {DENOISER: ROLE_DENOISER, "text_encoder": ROLE_TEXT_ENCODER, "vae": ROLE_VAE}
    lora_components = (DENOISER,)
    single_file_kinds = SINGLE_FILE_KINDS
    known_single_files = KNOWN_SINGLE_FILES

    def detect(self, model_index: dict) -> Optional[str]:
        return "toy" if model_index.get("_class_name") == PIPELINE_CLASS else None


class ToySampling(DiffusersFlowSampling):
    def load_pipeline(self, source: PipelineSource):
        if source.kind != SOURCE_DIFFUSERS:
            return super().load_pipeline(source)  # single files: assembled below; anything else refused
        dtype = {"torch_dtype": source.dtype} if source.dtype is not None else {}
        return ToyPipeline({name: cls.from_pretrained(source.path, subfolder=name, local_files_only=True,
                                                      use_safetensors=True, **dtype)
                            for name, cls in _CLASSES.items()}, ToyTokenizer())

    def assemble_single_files(self, source: PipelineSource):
        return ToyPipeline(source.components, source.tokenizer)

    def encode_text(self, model, text: str) -> ConditioningHandle:
        encoder = model.pipeline.text_encoder
        ids = model.pipeline.tokenizer(text)
        with torch.no_grad():
            embeds = encoder(ids.to(device_and_dtype(encoder)[0]))
        return ConditioningHandle(embeds=embeds.float().cpu(), family=model.family, text=text)

    def latent_shape(self, model, width: int, height: int, frames: int, batch: int) -> tuple:
        scale = model.pipeline.vae.config.scale
        check_multiple(width, height, scale, model)
        return (batch, model.pipeline.vae.config.z_dim, height // scale, width // scale)

    def empty_latent(self, model, width: int, height: int, frames: int = 1, batch: int = 1) -> LatentHandle:
        return LatentHandle(samples=torch.zeros(self.latent_shape(model, width, height, frames, batch)),
                            family=model.family, kind="image")

    def prediction(self, model, positive, negative, latent):
        def predict(expert, x, sigma, uncond):
            device, dtype = device_and_dtype(model.components[expert])
            context = (negative if uncond else positive).embeds.to(device, dtype)
            sigma_in = torch.full((x.shape[0], 1, 1), float(sigma), device=device, dtype=dtype)
            return self.forward(model, expert, x=x.to(device, dtype), sigma=sigma_in, context=context).float()

        return predict

    def decode(self, model, latent):
        vae = model.pipeline.vae
        device, dtype = device_and_dtype(vae)
        with torch.no_grad():
            image = vae.decode(latent.samples.to(device, dtype))  # [B, 3, H, W] in -1..1
        return (image.float().permute(0, 2, 3, 1) / 2 + 0.5).clamp(0.0, 1.0).cpu()


FAMILY = ModelFamily(id="toy", model_families=("toy",), layout=ToyLayout(),
                     keymap=KeyMap(recognizes=_recognizes, map_target=_map_target), contracts=OneScheduleContracts(),
                     sampling=ToySampling(), runs_stages=True)
