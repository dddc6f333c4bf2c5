"""The MiniMax-H3 family (``FAMILY``) and its layout, contracts and sampling parts: video + audio generation, two
DiT partitions chosen by the task (``transformer``: t2va / fl2va, ``transformer_ref``: ref2va), two explicit
schedules (video, audio)."""

from __future__ import annotations

from typing import Optional

from ..interface import SOURCE_DIFFUSERS, SOURCE_SINGLE_FILE, ModelFamily, PipelineSource, TinyRecipe
from ..parts import FamilyContracts, FamilyLayout, FamilySampling
from ..roles import ROLE_ALTERNATE, ROLE_DENOISER, ROLE_VAE, SHARED_INDEX_ROLES
from . import contracts, host, pipeline, references, sampling
from .key_layouts import HOST_DENOISERS, REFUSED_FILES
from .keymap import KEYMAP
from .latent_rgb import MINIMAX_H3_VIDEO_RGB
from .resolve import resolve


class MiniMaxH3Layout(FamilyLayout):
    # ``transformer`` runs t2va / fl2va; ``transformer_ref`` only ref2va, so a run loads one or the other
    index_roles = {"transformer": ROLE_DENOISER, "transformer_ref": ROLE_ALTERNATE, "audio_vae": ROLE_VAE,
                   **SHARED_INDEX_ROLES}
    lora_components = ("transformer",)
    requirements = {contracts.FAMILY_ID: {"diffusers": "0.42"}}  # MiniMax-H3 arrived in diffusers 0.42
    labels = {contracts.FAMILY_ID: "MiniMax-H3"}
    real_configs = ("minimax-h3",)
    # the factory builds both folders at once (the pinned one is a copy with a pinned release)
    tiny_models = tuple(TinyRecipe(name, contracts.FAMILY_ID) for name in ("tiny-minimax-h3", "tiny-minimax-h3-pinned"))
    refused_single_files = REFUSED_FILES
    host_denoisers = HOST_DENOISERS  # ComfyUI's own MiniMax-H3 MODEL (0.30.0), for LoraBindLoRA
    file_name_words = "minimax"
    # listed last: none featured
    example_templates = ("minimax_h3_turbo_8step", "minimax_h3_turbo_mp4", "minimax_h3_turbo_4step_768p",
                         "minimax_h3_native", "minimax_h3_pinned")

    def detect(self, model_index: dict) -> Optional[str]:
        class_name = str(model_index.get("_class_name", ""))
        return contracts.FAMILY_ID if "minimax" in class_name.lower() or "_minimax_h3" in model_index else None


class MiniMaxH3Contracts(FamilyContracts):
    """Turbo / native / checkpoint-pinned contracts, resolved into two schedules, a task and a partition; the
    contract node reads an adapter's own contract (``adapter_contract``), binds it (``bound``) and says it
    (``describe``)."""

    tasks = contracts.TASKS  # what its adapters are made for (the contract node's choices)
    turbo_grammar = contracts.TURBO_GRAMMAR  # how a Turbo file's name declares its contract
    declared_contract = staticmethod(contracts.declared_contract)
    checkpoint_contract = staticmethod(contracts.checkpoint_contract)
    adapter_contract = staticmethod(contracts.file_contract)
    describe = staticmethod(contracts.describe_contract)
    view = staticmethod(contracts.contract_dict)  # what the contract node shows (its text lines are separate)
    # on ComfyUI's own MiniMax-H3 MODEL (0.30.0): the host model's defaults, the flow_shift and the audio schedule
    on_host = staticmethod(host.on_host)
    explain_host_sigmas = staticmethod(host.explain_host_sigmas)
    host_sampling_problem = staticmethod(host.host_sampling_problem)

    def bound(self, contract, model_index: dict, scale: float, task: str):
        """The adapter's contract on this checkpoint, at ``scale``, for ``task``."""
        return contracts.with_scale(contracts.on_checkpoint(contract, model_index), scale, task)

    def contract_to_dict(self, contract) -> dict:
        return {**self.view(contract), "text": self.describe(contract)}

    def resolve_schedule(self, model_handle, contract_list: tuple, request):
        return resolve(contract_list, request, model_handle)


class MiniMaxH3Sampling(FamilySampling):
    """Its modular pipeline, the two-schedule loop, and the soundtrack, first frame and references only it has."""

    max_references = references.MAX_IMAGE_REFERENCES  # reference images one ref2va run takes
    latent_rgb_maps = (MINIMAX_H3_VIDEO_RGB,)

    def load_pipeline(self, source: PipelineSource):
        if source.kind == SOURCE_SINGLE_FILE:
            raise ValueError(f"{source.path}: MiniMax-H3 does not load from single files; it runs from its diffusers "
                             "folder (models/diffusers/, LoraBindModelLoader)")
        if source.kind != SOURCE_DIFFUSERS:
            raise ValueError(f"{source.path}: cannot load a {source.kind!r} source for MiniMax-H3 models")
        return pipeline.load_pipeline(source.path, source.model_index, dtype=source.dtype)

    # text, latents, sampling, decoding
    def encode_text(self, model, text: str):
        return pipeline.encode_prompt(model, text)

    def empty_latent(self, model, width: int, height: int, frames: int = 1, batch: int = 1):
        return pipeline.empty_latents(model, width=width, height=height, frames=frames, batch=batch)

    def implied_task(self, latent) -> Optional[str]:
        return pipeline.implied_task(latent)

    def check_inputs(self, model, positive, negative, latent, schedule) -> None:
        sampling.check_inputs(model, positive, negative, latent, schedule)

    def denoise(self, model, positive, negative, latent, schedule, seed: int, *, on_step=None, on_latent=None,
                check_interrupt=None):
        return sampling.denoise(self.forward, model, positive, negative, latent, schedule, seed,
                                on_step=on_step, on_latent=on_latent, check_interrupt=check_interrupt)

    def batch_rule(self, model, component: str):
        return sampling.NOT_BATCHED

    def decode(self, model, latent):
        return pipeline.decode(model, latent)

    def decode_audio(self, model, latent) -> dict:
        """The soundtrack -> ComfyUI AUDIO (only this family has one)."""
        return pipeline.decode_audio(model, latent)

    def with_first_frame(self, model, latent, image):
        """The latent anchored on a first frame (task fl2va)."""
        return pipeline.with_first_frame(model, latent, image)

    def with_references(self, model, latent, images):
        """The latent with reference images appended (task ref2va)."""
        return references.with_references(model, latent, images)


FAMILY = ModelFamily(id=contracts.FAMILY_ID, model_families=(contracts.FAMILY_ID,), layout=MiniMaxH3Layout(),
                     keymap=KEYMAP, contracts=MiniMaxH3Contracts(), sampling=MiniMaxH3Sampling(), has_audio=True)
