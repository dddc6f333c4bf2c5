"""``FamilyLayout``: what is known of a family's models before one is loaded.

The roles of a ``model_index.json``'s components (``component_roles``: what the planner and placement size and
move), which denoiser a LoRA file goes to and the slot check (``component_for_file``, ``check_slots``), the
library versions and labels (``requirements``, ``labels``), the real configurations ``lorabind plan`` ships
(``real_configs``), the built-in tiny models (``tiny_models``: recipes the factory builds) and its single files:
their kinds, key layouts, configurations and tokenizers (``single_file_kinds``, ``known_single_files``), how a set
names its parts (``single_file_parts``, ``single_file_edition``, ``check_expert_files``). Asked through the
registry, so no module outside ``families/`` names a component or keys a table by family id.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ...errors import KeyMatchError
from ...io.model_index import is_set
from ..roles import DENOISER_ROLES, ROLE_ALTERNATE, ROLE_DENOISER
from .bound import FamilyPart


class FamilyLayout(FamilyPart):
    """Defaults: one denoiser role per component, the main denoiser for every LoRA file, no slot rule."""

    # {model_index component: ROLE_*} of the components with weights; the first denoiser is the main one
    index_roles: dict = {}
    # the denoisers a LoRA can be attached to by name (the adapter nodes' ``component`` choices)
    lora_components: tuple = ()
    # {requirements id: {distribution: minimum version}} and {requirements id: label} (``loaders.models.compat``)
    requirements: dict = {}
    labels: dict = {}
    real_configs: tuple = ()  # folders under the family package's ``configs/models/`` (``lorabind plan NAME``)
    tiny_models: tuple = ()  # TinyRecipe of each built-in tiny model
    # single files (``io.single_file_kinds``): the kinds this family loads (ComponentKind), their known
    # configurations (KnownModel) and the files it recognises but refuses (RefusedKind)
    single_file_kinds: tuple = ()
    known_single_files: tuple = ()
    refused_single_files: tuple = ()
    # denoisers whose LoRAs the ComfyUI-native nodes map onto a host's own model but that lorabind does not load
    # from single files (``io.single_file_kinds.HostDenoiser``)
    host_denoisers: tuple = ()
    # a regex of the words a LoRA file's name carries when it is made for this family's models ("qwen"): another
    # family's name rules leave such a file alone (a Qwen-Image Lightning file is not a Wan distill file)
    file_name_words: str = ""
    # the served example templates (``workflows/``) of this family, most important first, of which the first
    # ``featured_examples`` are listed before every family's other examples (``families.example_order``)
    example_templates: tuple = ()
    featured_examples: int = 0
    # the model family id of a model whose denoisers are experts of this family (Wan: "wan2.2_moe"): a host's
    # denoiser known to be one of them (its file name, a pair node) is called so, not by its shape's family
    expert_model_family: str = ""

    def detect(self, model_index: dict) -> Optional[str]:
        """The model family id a ``model_index.json`` describes when it is this family's, else None."""
        raise NotImplementedError

    def requirements_id(self, model_family: str, model_index: Optional[dict] = None,
                        variant: Optional[str] = None, folder: Optional[Path] = None) -> str:
        """The ``requirements`` entry ``compat.require`` checks before loading a model of ``model_family`` from a
        folder (``model_index``; ``folder`` where a variant shows only in a component's config) or single files
        (detected ``variant``): the family id, unless a variant of it came with a newer library release."""
        return model_family

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

    def denoiser_roles(self, model) -> dict:
        """{denoiser component name: role} of a loaded model (``ROLE_*``)."""
        return {name: ROLE_DENOISER for name in model.components}

    def component_for_file(self, model_index: dict, file_name: str, *, strict: bool = True) -> str:
        """The denoiser a LoRA file goes to when none is named: the main one (a family with experts overrides
        this to read the file name; ``strict`` False picks the main one where the name does not say)."""
        return self.denoiser_components(model_index)[0]

    def check_slots(self, model_index: dict, assignments: list, slot_names: Optional[dict] = None) -> None:
        """Refuse (``KeyMatchError``) LoRA files put into a denoiser their names say is the wrong one.
        ``assignments``: ``(component, file name, input name or "")``; ``slot_names`` ({component: what the user
        sees}) words the message in the caller's terms. Nothing to check without experts."""

    def single_file_parts(self, denoisers: list, vae, text_encoder, image_encoder=None) -> dict:
        """{component name: part} for the parts of a single-file set, named as this family's diffusers folder
        names them (denoisers in ``lora_components`` order)."""
        named = dict(zip(self.lora_components, denoisers))
        if len(named) < len(denoisers):
            raise KeyMatchError(f"{self.family.id} models take at most {len(self.lora_components)} denoiser file(s)")
        named.update(vae=vae, text_encoder=text_encoder)
        if image_encoder is not None:
            named["image_encoder"] = image_encoder
        return named

    def single_file_edition(self, role: str, file_name: str, flags: tuple) -> tuple:
        """(edition title or None, {config field: value}) of a single file whose shapes equal another edition's
        (Qwen-Image-Edit vs Qwen-Image): what its name or its weightless marker keys (``flags``) say."""
        return None, {}

    def check_expert_files(self, denoisers: tuple) -> None:
        """Refuse (ModelLoadError naming both files) two single files, high-noise first
        (``single_file.detect.Detected``), that have the shapes of this family's experts but are not a pair of
        them; the shapes were already checked (Wan: a Wan2.1 14B file given as a Wan2.2 A14B expert)."""
