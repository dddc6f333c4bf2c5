"""The one interface every model family implements (``loaders/families/<family>/``): ``ModelFamily``, a few frozen
facts and four parts (``families/parts``).

Why one interface: everything that differs between model families (how a pipeline is loaded, which denoiser
plays which role, the LoRA key names, the sampling contracts, text encoding, latent geometry, the model forward,
decoding, family-specific sampling) is answered by the family object, so nodes, the CLI, the server and the
shared engine never test a family name. Adding a family means adding one package that declares its parts and one
``FAMILY = ModelFamily(...)`` (plus its tiny-model recipe), and listing it in ``families/__init__.py``.

What is known before loading is the family's too (``family.layout``), so no module outside ``families/`` names a
component or keys a table by family id. This module also holds the vocabulary the parts and the engine share:
``PipelineSource`` and ``TinyRecipe`` (the component roles are ``roles``, which the parts speak too).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from .parts import FamilyContracts, FamilyLayout, FamilySampling, KeyMap
from .roles import ROLE_LOW_NOISE

SOURCE_DIFFUSERS = "diffusers"
SOURCE_SINGLE_FILE = "single_file"


@dataclass(frozen=True)
class TinyRecipe:
    """A built-in tiny model of a family: ``name`` (its folder under ``models/diffusers``) and the requirements id
    it needs (``FamilyLayout.requirements``). The family says which built-ins it has; the tiny-model factory
    (``tiny_models``, which the engine never imports) holds the builder of each name and refuses a recipe it has
    no builder for."""

    name: str
    requirements_id: str


@dataclass(frozen=True)
class PipelineSource:
    """Where a model's pipeline is loaded from.

    ``kind`` "diffusers": a diffusers folder (``path`` holding ``model_index.json``, already read into
    ``model_index``); ``dtype`` a torch dtype for every weighted component, or ``{component: torch dtype}`` (what
    ``dtype=auto`` gives: each as stored; diffusers loads a component missing there in float32);
    ``components``: modules already built (the
    denoisers read split under tensor parallelism), which the pipeline takes instead of loading them.
    ``kind`` "single_file": modules already built from ComfyUI's single files (``loaders.models.single_file``), named as
    the equivalent diffusers folder names them (``transformer``, ``transformer_2``, ``vae``, ``text_encoder``,
    ``image_encoder``), in ``components``, with their ``tokenizer``; ``variant`` is what detection named ("t2v",
    "i2v", "ti2v", or None), ``denoiser_files`` what it found for each denoiser file
    (``single_file.detect.Detected``, high-noise first) and ``path`` the first denoiser file. The family
    assembles its pipeline from them.
    """

    path: str
    model_index: dict = field(default_factory=dict)
    kind: str = SOURCE_DIFFUSERS
    dtype: Any = None
    components: dict = field(default_factory=dict)
    tokenizer: Any = None
    variant: Optional[str] = None
    denoiser_files: tuple = ()


@dataclass(frozen=True, eq=False, kw_only=True)
class ModelFamily:
    """A model family: frozen facts plus four parts (``parts``), each answering one kind of question.

    ``layout``: what is known before loading (roles, requirements, single files); ``keymap``: the LoRA key
    names; ``contracts``: the sampling contracts; ``sampling``: load, encode, latents, denoise, decode. A family
    package declares one ``FAMILY = ModelFamily(...)`` from its own parts; the parts ask each other through the
    family they are bound to here.
    """

    id: str  # key-map family id ("wan", "qwen_image", "minimax_h3"), shown by ``inspect``
    model_families: tuple  # the LoadedModel.family values served ("wan2.1", "wan2.2_moe")
    layout: FamilyLayout
    keymap: KeyMap
    contracts: FamilyContracts
    sampling: FamilySampling
    has_audio: bool = False  # the model generates a soundtrack on its own schedule (``audio_flow_shift``)
    # Stages (sigmas input, start/end step, denoise, add_noise) and the scheduler choice: a family whose denoise
    # runs one sigma list runs any slice of it; False refuses those inputs by name.
    runs_stages: bool = False
    reference_scheduler: str = "euler"  # what the family's reference pipeline steps with (scheduler "default")

    def __post_init__(self):
        for part in (self.layout, self.contracts, self.sampling):
            part.bind(self)

    def serves(self, model) -> bool:
        """True when ``model`` (anything with ``.family``: LoadedModel, handles) is this family's."""
        return getattr(model, "family", None) in self.model_families


def pipeline_index(pipeline) -> dict:
    """The ``model_index.json`` a diffusers folder of ``pipeline`` would hold (its registered components and
    options, ``[library, class]`` lists): what a pipeline assembled from single files reports as its index."""
    index = {"_class_name": type(pipeline).__name__}
    for key, value in dict(pipeline.config).items():
        index[key] = list(value) if isinstance(value, tuple) else value
    return index


def has_expert_pair(family: ModelFamily, model) -> bool:
    """True for a model whose denoising switches between a high-noise and a low-noise expert (Wan2.2 MoE)."""
    return ROLE_LOW_NOISE in family.layout.denoiser_roles(model).values()
