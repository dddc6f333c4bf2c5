"""What is known of a Wan model before loading: its components' roles, the expert a LoRA file goes to, the
library versions of each variant, the shipped real configurations and tiny models, and its single files."""

from __future__ import annotations

from typing import Optional

from ...io.model_index import is_set
from ..interface import TinyRecipe
from ..parts import FamilyLayout
from ..roles import ROLE_DENOISER, ROLE_HIGH_NOISE, ROLE_LOW_NOISE, SHARED_INDEX_ROLES
from . import contracts, slots
from . import single_file_kinds as files
from .single_files import check_expert_files
from .slots import HIGH_NOISE_EXPERT, LOW_NOISE_EXPERT

TI2V_REQUIREMENTS = "wan2.2_ti2v"  # its ``requirements`` entry
VACE_REQUIREMENTS = "wan_vace"
VACE_PIPELINE = "WanVACEPipeline"  # a VACE folder's model_index ``_class_name``
# From checks against older releases (diffusers 0.32-0.35): WanPipeline appears in diffusers 0.33, its
# transformer_2/boundary_ratio (Wan2.2 MoE) in 0.35, and expand_timesteps (TI2V) came with Wan2.2 in 0.35.
REQUIREMENTS = {"wan2.1": {"diffusers": "0.33"}, contracts.MOE_FAMILY: {"diffusers": "0.35"},
                TI2V_REQUIREMENTS: {"diffusers": "0.35"},
                # WanVACEPipeline with transformer_2/boundary_ratio (the Wan2.2 VACE Fun pair): read in 0.36 and
                # 0.42; 0.35 and older were not checked, so 0.36 is the floor
                VACE_REQUIREMENTS: {"diffusers": "0.36"}}
LABELS = {"wan2.1": "Wan2.1", contracts.MOE_FAMILY: "Wan2.2 MoE", TI2V_REQUIREMENTS: "Wan2.2 TI2V",
          VACE_REQUIREMENTS: "Wan VACE"}
TINY_MODELS = (
    TinyRecipe("tiny-wan22-t2v", contracts.MOE_FAMILY),
    TinyRecipe("tiny-wan21-t2v", "wan2.1"),
    TinyRecipe("tiny-wan22-i2v", contracts.MOE_FAMILY),
    TinyRecipe("tiny-wan21-i2v", "wan2.1"),
    TinyRecipe("tiny-wan22-ti2v", TI2V_REQUIREMENTS),
    TinyRecipe("tiny-wan21-vace", VACE_REQUIREMENTS),
    TinyRecipe("tiny-wan22-vace-fun", VACE_REQUIREMENTS),
)


class WanLayout(FamilyLayout):
    index_roles = {HIGH_NOISE_EXPERT: ROLE_DENOISER, LOW_NOISE_EXPERT: ROLE_LOW_NOISE, **SHARED_INDEX_ROLES}
    lora_components = (HIGH_NOISE_EXPERT, LOW_NOISE_EXPERT)
    requirements = REQUIREMENTS
    labels = LABELS
    real_configs = ("wan2.1-t2v-1.3b", "wan2.1-t2v-14b", "wan2.2-t2v-a14b", "wan2.2-i2v-a14b", "wan2.2-ti2v-5b",
                    "wan2.1-vace-14b", "wan2.2-vace-fun-a14b")
    tiny_models = TINY_MODELS
    single_file_kinds = files.KINDS
    known_single_files = files.KNOWN_MODELS
    # the main example first, then the other Wan examples; the adapter and single-file variants after the other
    # families' featured ones
    example_templates = ("wan22_lightx2v_4step", "wan22_i2v_lightx2v_4step", "wan22_mismatched_contract",
                         "wan22_lightning_three_stage", "wan22_strength_schedule", "wan21_distill",
                         "wan21_unipc_reference", "wan21_i2v", "wan22_ti2v", "wan21_vace_control", "wan22_tiny_t2v",
                         "peft_two_branches", "wan22_single_files_fp8", "wan22_gguf_lightx2v")
    featured_examples = 10
    expert_model_family = contracts.MOE_FAMILY

    def detect(self, model_index: dict) -> Optional[str]:
        if not str(model_index.get("_class_name", "")).startswith("Wan"):
            return None
        return contracts.MOE_FAMILY if is_set(model_index.get(LOW_NOISE_EXPERT)) else "wan2.1"

    def component_roles(self, model_index: dict) -> dict:
        """With ``transformer_2`` set, ``transformer`` runs the high-noise steps (Wan2.2's ``boundary_ratio``)."""
        roles = super().component_roles(model_index)
        if LOW_NOISE_EXPERT in roles and HIGH_NOISE_EXPERT in roles:
            roles[HIGH_NOISE_EXPERT] = ROLE_HIGH_NOISE
        return roles

    def component_for_file(self, model_index: dict, file_name: str, *, strict: bool = True) -> str:
        """A two-expert model: the expert the file name says (``…high_noise…`` / ``…low_noise…``)."""
        if LOW_NOISE_EXPERT not in self.component_roles(model_index):
            return HIGH_NOISE_EXPERT
        return slots.expert_for_file(file_name, strict=strict)

    def check_slots(self, model_index: dict, assignments: list, slot_names: Optional[dict] = None) -> None:
        if LOW_NOISE_EXPERT in self.component_roles(model_index):
            slots.check_slots(assignments, slot_names)

    def requirements_id(self, model_family, model_index=None, variant=None, folder=None):
        # TI2V-5B is a one-transformer "wan2.1"-shaped pipeline, but expand_timesteps arrived later (Wan2.2)
        if variant == "vace" or (model_index or {}).get("_class_name") == VACE_PIPELINE:
            return VACE_REQUIREMENTS
        if variant == "ti2v" or (model_index or {}).get("expand_timesteps"):
            return TI2V_REQUIREMENTS
        return model_family

    check_expert_files = staticmethod(check_expert_files)

    def denoiser_roles(self, model) -> dict:
        if model.family != contracts.MOE_FAMILY:
            return {name: ROLE_DENOISER for name in model.components}
        return {name: role for name, role in self.component_roles(model.model_index).items()
                if name in model.components}
