"""What differs between the places a model is loaded from, behind the one loading sequence (``model_store.load``).

Loading is one sequence whatever the model comes from: resolve the options, return the shared copy when there is
one, check the installed libraries, choose the memory plan before any weight is read (refusing when nothing
fits), let the host free device memory, build the pipeline, place its components under the plan, apply the speed
options. ``model_store.load`` runs it once for every kind; a ``ModelSource`` answers only the questions whose
answer depends on the kind. Kinds: a diffusers folder (``loaders.models.diffusers_folder.DiffusersFolder``) and a set of
ComfyUI single files (``loaders.models.single_file.pipelines.SingleFileSet``). Adding one (GGUF files) is one subclass in
its own file.

A leaf: it imports nothing of ours, so every source and the model store may import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BuiltModel:
    """What a source's ``build`` made, for the ``LoadedModel`` the sequence returns."""

    pipeline: Any  # the family's pipeline object (``LoadedModel.pipeline``)
    model_family: str  # ``LoadedModel.family``: "wan2.2_moe", "qwen_image", ...
    model_index: dict  # the folder's ``model_index.json``, or the one an equivalent folder would hold
    modules: dict  # {component: module} that the memory plan places (non-modules are ignored)
    roles: dict  # {component: ROLE_*} as the family's layout names them (``component_roles``)
    denoisers: dict  # {denoiser component: module}, the main one first (``LoadedModel.components``)
    # where each denoiser weight can be re-read from (``LoadedModel.weight_sources``); None: the folder's files
    weight_sources: Any = None


class ModelSource:
    """One place a model is loaded from. Attributes: ``path`` (``LoadedModel.path``: the folder, or the first
    denoiser file), ``name`` (``LoadedModel.name``) and ``label`` (what messages call it)."""

    path: str = ""
    name: str = ""
    label: str = ""

    def default_dtype(self):
        """The torch dtype for ``dtype`` None/"auto"; None keeps what the source stores (a folder's own dtype)."""
        return None

    def cache_identity(self) -> tuple:
        """``(identity, version)``: what the source is (resolved paths) and which version of it (mtimes). The
        shared model of an older version of the same source is released when a newer one is loaded."""
        raise NotImplementedError

    def cache_options(self) -> tuple:
        """Options of the source that make a different model from the same files (single files' fp8 rounding)."""
        return ()

    def check(self) -> None:
        """Refuse before anything is read: library versions the family needs, files that are not loaded
        (pickle). Raises ``ModelLoadError`` naming the file."""

    def component_roles(self) -> dict:
        """{component: ROLE_*} of the components with weights, known before loading (the CPU plan's list)."""
        raise NotImplementedError

    def denoiser_heads(self) -> dict:
        """{denoiser component: attention heads} from the configs, before loading (what a sequence split is
        checked against); {} when the source cannot tell."""
        return {}

    def component_sizes(self, dtype) -> list:
        """``memory.ComponentSize`` of each weighted component at ``dtype`` (None: as stored), from configs and
        headers: no weight is read."""
        raise NotImplementedError

    def build(self, dtype, split=None) -> BuiltModel:
        """Read the weights and assemble the family's pipeline at ``dtype`` (None: as stored), on the host.
        ``split`` (``split_loading.SplitLoad``, under ``--parallel tp=N``): read each denoiser split, this rank's
        rows or columns only; a source that ignores it has its denoisers split after loading, at the whole
        model's peak."""
        raise NotImplementedError
