"""The one interface every model family implements (``loaders/families/<family>/``).

Why one interface: everything that differs between model families (how a pipeline is loaded, which denoiser
plays which role, the LoRA key names, the sampling contracts, text encoding, latent geometry, the model forward,
decoding, family-specific sampling) is answered by the family object, so nodes, the CLI, the server and the
shared engine never test a family name. Adding a family means adding one package implementing ``ModelFamily``
(plus its tiny-model recipe) and listing it in ``families/__init__.py``.

What is known before loading is the family's too, so no module outside ``families/`` names a component or keys a
table by family id: the roles of a ``model_index.json``'s components (``component_roles``: what the planner and
placement size and move), which denoiser a LoRA file goes to and the slot check (``component_for_file``,
``check_slots``, both used by ``check_artifact``), the library versions and labels (``requirements``,
``labels``), the real configurations ``lorabind plan`` ships (``real_configs``), the built-in tiny models
(``tiny_models``: recipes the factory builds) and the component names of single files (``single_file_parts``).

Hooks for later work, by design:
- ``load_pipeline`` takes a ``PipelineSource``: a diffusers folder, or modules built from single files;
- every denoiser forward goes through ``ModelFamily.forward`` (one place per family to wrap with a
  swap/offload hook).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from ..errors import KeyMatchError
from ..io.model_index import is_set
from ..contracts.schedule_rules import contract_dict

# Component roles (``ModelFamily.denoiser_roles`` / ``components``), the vocabulary ``loaders.placement`` plans with.
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


SOURCE_DIFFUSERS = "diffusers"
SOURCE_SINGLE_FILE = "single_file"

# The components most diffusers pipelines name the same way (each family's ``index_roles`` starts from these).
SHARED_INDEX_ROLES = {"text_encoder": ROLE_TEXT_ENCODER, "image_encoder": ROLE_IMAGE_ENCODER, "vae": ROLE_VAE}


@dataclass(frozen=True)
class TinyRecipe:
    """A built-in tiny model of a family: ``name`` (its folder under ``models/diffusers``), the requirements id
    it needs (``ModelFamily.requirements``), and the builder the tiny-model factory runs: ``builder`` in module
    ``module`` (relative to ``tiny_models`` when it starts with a dot), ``builder(models_root)``. Named,
    not imported, so the engine never imports the factory."""

    name: str
    requirements_id: str
    module: str
    builder: str


@dataclass(frozen=True)
class PipelineSource:
    """Where a model's pipeline is loaded from.

    ``kind`` "diffusers": a diffusers folder (``path`` holding ``model_index.json``, already read into
    ``model_index``); ``dtype`` None keeps the folder's own dtype.
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


class ModelFamily:
    """Base class of the family objects; subclasses override what differs and inherit the shared defaults.

    ``model`` arguments are ``loaders.models.store.LoadedModel`` objects (``model.family`` is one of this
    family's ``model_families``); ``model_handle`` arguments are ``loaders.handles.ModelHandle`` objects.
    """

    id: str = ""  # key-map family id ("wan", "qwen_image", "minimax_h3"), shown by ``inspect``
    model_families: tuple = ()  # the LoadedModel.family values served ("wan2.1", "wan2.2_moe")
    has_audio: bool = False  # the model generates a soundtrack on its own schedule (``audio_flow_shift``)
    # Stages (sigmas input, start/end step, denoise, add_noise) and the scheduler choice: a family whose denoise
    # runs one sigma list runs any slice of it; False refuses those inputs by name.
    runs_stages: bool = False
    reference_scheduler: str = "euler"  # what the family's reference pipeline steps with (scheduler "default")
    # {model_index component: ROLE_*} of the components with weights; the first denoiser is the main one
    index_roles: dict = {}
    # the denoisers a LoRA can be attached to by name (the adapter nodes' ``component`` choices)
    lora_components: tuple = ()
    # {requirements id: {distribution: minimum version}} and {requirements id: label} (``loaders.models.compat``)
    requirements: dict = {}
    labels: dict = {}
    real_configs: tuple = ()  # folders under ``loaders/placement/real_configs`` (``lorabind plan NAME``)
    tiny_models: tuple = ()  # TinyRecipe of each built-in tiny model

    def serves(self, model) -> bool:
        """True when ``model`` (anything with ``.family``: LoadedModel, handles) is this family's."""
        return getattr(model, "family", None) in self.model_families

    # ---------------------------------------------------------------------------------------------------------
    # detection, loading, components

    def detect(self, model_index: dict) -> Optional[str]:
        """The model family id a ``model_index.json`` describes when it is this family's, else None."""
        raise NotImplementedError

    def requirements_id(self, model_family: str, model_index: Optional[dict] = None,
                        variant: Optional[str] = None, folder: Optional[Path] = None) -> str:
        """The ``compat.REQUIREMENTS`` entry checked before loading a model of ``model_family`` from a folder
        (``model_index``; ``folder`` where a variant shows only in a component's config) or single files (detected
        ``variant``): the family id, unless a variant of it came with a newer library release than the family."""
        return model_family

    def load_pipeline(self, source: PipelineSource):
        """The pipeline object (``LoadedModel.pipeline``) for ``source``; raises on an unsupported source.
        A single-file source's pipeline reports its ``model_index`` as ``pipeline_index(pipeline)`` does."""
        raise NotImplementedError

    def denoiser_roles(self, model) -> dict:
        """{denoiser component name: role} of a loaded model (``ROLE_*``)."""
        return {name: ROLE_DENOISER for name in model.components}

    def component_roles(self, model_index: dict) -> dict:
        """{component: ROLE_*} of the set components of a ``model_index.json`` with weights (tokenizers and
        schedulers have none), in index order: what the planner sizes and placement moves."""
        return {name: self.index_roles[name] for name in model_index
                if name in self.index_roles and is_set(model_index[name])}

    def denoiser_components(self, model_index: dict) -> list:
        """The set denoiser components of an index, the main one first (alternates last)."""
        roles = self.component_roles(model_index)
        return ([n for n, r in roles.items() if r in DENOISER_ROLES] +
                [n for n, r in roles.items() if r == ROLE_ALTERNATE])

    def component_for_file(self, model_index: dict, file_name: str, *, strict: bool = True) -> str:
        """The denoiser a LoRA file goes to when none is named: the main one (a family with experts overrides
        this to read the file name; ``strict`` False picks the main one where the name does not say)."""
        return self.denoiser_components(model_index)[0]

    def check_slots(self, model_index: dict, assignments: list) -> None:
        """Refuse (``KeyMatchError``) LoRA files put into a denoiser their names say is the wrong one.
        ``assignments``: ``(component, file name, input name or "")``. Nothing to check without experts."""

    def single_file_parts(self, denoisers: list, vae, text_encoder, image_encoder=None) -> dict:
        """{component name: part} for the parts of a single-file set, named as this family's diffusers folder
        names them (denoisers in ``lora_components`` order)."""
        named = dict(zip(self.lora_components, denoisers))
        if len(named) < len(denoisers):
            raise KeyMatchError(f"{self.id} models take at most {len(self.lora_components)} denoiser file(s)")
        named.update(vae=vae, text_encoder=text_encoder)
        if image_encoder is not None:
            named["image_encoder"] = image_encoder
        return named

    def single_file_edition(self, role: str, file_name: str, flags: tuple) -> tuple:
        """(edition title or None, {config field: value}) of a single file whose shapes equal another edition's
        (Qwen-Image-Edit vs Qwen-Image): what its name or its weightless marker keys (``flags``) say."""
        return None, {}

    def forward(self, model, component: str, **inputs):
        """THE denoiser forward: every model prediction of the family calls its denoisers through here."""
        return model.components[component](**inputs)

    # ---------------------------------------------------------------------------------------------------------
    # LoRA key map (used by ``loaders.lora.mapping`` / ``accounting`` and ``inspect``)

    def recognizes(self, lora) -> bool:
        """True when the file's module names are this family's (used without a model, e.g. ``inspect``)."""
        raise NotImplementedError

    def prepare(self, lora, model_family: str):
        """Family-specific rewrites of a ``LoraFile`` before name mapping (absent-alpha rule, fused-QKV split)."""
        return lora

    def map_target(self, name: str) -> Optional[str]:
        """File-side module name (prefixes and layout suffixes already stripped) -> diffusers module path."""
        raise NotImplementedError

    def expected_unmatched_reason(self, name: str, model_family: str) -> Optional[str]:
        """Why a key that does not fit this model is expected (e.g. Wan2.1 I2V image branch on Wan2.2)."""
        return None

    # ---------------------------------------------------------------------------------------------------------
    # contracts

    def declared_contract(self, file_name: str, metadata: dict, rank: Optional[int], table=None):
        """The ScheduleContract an artifact declares by name/metadata, or None; ContractError if refused.
        ``file_name`` is the file's name with the folder holding it (release layouts keep the step count
        there); ``table`` a matching user contract table entry (``contract_table.TableEntry``) or None: the
        file's metadata wins over it, and it wins over the name."""
        return None

    def check_expert_files(self, denoisers: tuple) -> None:
        """Refuse (ModelLoadError naming both files) two single files, high-noise first
        (``single_file.detect.Detected``), that have the shapes of this family's experts but are not a pair of
        them; the shapes were already checked (Wan: a Wan2.1 14B file given as a Wan2.2 A14B expert)."""

    def check_artifact(self, model, file_name: str, component: str) -> None:
        """Refuse a LoRA file made for another kind of model of this family or another slot, before anything is
        fused (Wan: an I2V file on a T2V expert and the reverse, ContractError; a low-noise file in the
        high-noise expert, KeyMatchError): ``check_slots`` plus the family's own artifact rules."""
        self.check_slots(model.model_index, [(component, file_name, "")])

    def checkpoint_contract(self, model_index: dict, model_name: str):
        """A ScheduleContract pinned by the checkpoint itself (``model_index.json``), or None."""
        return None

    def contract_to_dict(self, contract) -> dict:
        """JSON-able view of one of this family's contracts (node UI, ``inspect --json``), with a ``text`` line."""
        return contract_dict(contract)

    def resolve_schedule(self, model_handle, contracts: tuple, request):
        """The ResolvedSchedule for a SamplingRequest under ``contracts``; ContractError before any weight moves."""
        raise NotImplementedError

    # ---------------------------------------------------------------------------------------------------------
    # text, latents, sampling, decoding

    def encode_text(self, model, text: str):
        """One prompt through the model's own text encoder -> ConditioningHandle (CPU, float32, batch 1)."""
        raise NotImplementedError

    def encode_with_images(self, model, text: str, images: list):
        """One prompt read together with input IMAGEs (an image-editing model) -> ConditioningHandle carrying
        what its denoiser needs of the images; ValueError naming the input when the model takes none."""
        raise ValueError(f"model {model.name!r} ({model.family}) takes no input images with its prompt; encode the "
                         "prompt with LoraBindTextEncode")

    def image_rules(self, model, images: list) -> list:
        """Lines saying how the model resizes input images for ``encode_with_images`` (node output)."""
        return []

    def latent_shape(self, model, width: int, height: int, frames: int, batch: int) -> tuple:
        """The latent shape for an output size; ValueError/LoraBindError naming the bad field."""
        raise NotImplementedError

    def empty_latent(self, model, width: int, height: int, frames: int = 1, batch: int = 1):
        """A zero LatentHandle of the family's shape: the sampler's start point for text-to-X."""
        raise NotImplementedError

    def image_latent(self, model, start_image, end_image, width: int, height: int, frames: int, batch: int = 1):
        """The start LatentHandle of an image-to-video run from ComfyUI IMAGEs (``end_image`` may be None)."""
        raise ValueError(f"model {model.name!r} ({model.family}) does not generate video from a start image")

    def control_latent(self, model, control_video, control_masks, reference_images, width: int, height: int,
                       frames: int, strength: float, batch: int = 1):
        """The start LatentHandle of a controlled video run (Wan VACE) from a control video (IMAGE), its masks
        (MASK) and reference images (IMAGE), each may be None; ValueError naming the input it cannot take."""
        raise ValueError(f"model {model.name!r} ({model.family}) takes no control video")

    def implied_task(self, latent) -> Optional[str]:
        """The sampling task a latent implies (MiniMax-H3: anchored on a first frame -> ``fl2va``), else None."""
        return None

    def effective_boundary(self, model, schedule) -> Optional[float]:
        """The sigma where a two-expert model switches experts for ``schedule``; None when there is no switch."""
        return None

    def experts_per_step(self, model, schedule) -> Optional[list]:
        """The denoiser each step runs on, or None when the denoiser follows the task, not the sigmas."""
        return None

    def check_stage(self, model_handle, schedule, enforce: bool) -> list:
        """Refuse a stage (``schedule.start_step``..``stage_end``) the model's artifacts do not allow (ContractError
        naming the artifact and the input), before anything touches a weight; with ``enforce`` off, the override
        lines instead."""
        return []

    def check_inputs(self, model, positive, negative, latent, schedule) -> None:
        """Refuse inputs that cannot be sampled together, naming the input; cheap and weight-free."""
        raise NotImplementedError

    def run_warnings(self, model) -> list:
        """Lines the sampler shows (ui text, report, CLI, WebSocket) when a run will go ahead but is very likely
        not what the user meant, e.g. one expert of a two-expert model run alone; none by default."""
        return []

    def denoise(self, model, positive, negative, latent, schedule, seed: int, *,
                on_step: Optional[Callable[[int, int], None]] = None,
                check_interrupt: Optional[Callable[[], None]] = None):
        """Sample ``latent`` over the resolved ``schedule`` exactly -> a new LatentHandle."""
        raise NotImplementedError

    def decode(self, model, latent):
        """Latent -> ComfyUI IMAGE, float [frames, H, W, 3] in 0..1."""
        raise NotImplementedError


def pipeline_index(pipeline) -> dict:
    """The ``model_index.json`` a diffusers folder of ``pipeline`` would hold (its registered components and
    options, ``[library, class]`` lists): what a pipeline assembled from single files reports as its index."""
    index = {"_class_name": type(pipeline).__name__}
    for key, value in dict(pipeline.config).items():
        index[key] = list(value) if isinstance(value, tuple) else value
    return index


def has_expert_pair(family: ModelFamily, model) -> bool:
    """True for a model whose denoising switches between a high-noise and a low-noise expert (Wan2.2 MoE)."""
    return ROLE_LOW_NOISE in family.denoiser_roles(model).values()
