"""Apply a ``MemoryPlan`` to a loaded model at run time: where each component lives and when it moves.

The planner (``loaders.placement``) decides, per component, one of ``device`` | ``host`` | ``swap`` | ``blocks`` |
``on_demand``; this module makes it so and keeps it so while the sampler binds LoRAs and denoises:

* ``device``: moved once (``module.to``).
* ``blocks``: diffusers' group offload, block level, one block per group; on CUDA with a side stream, which
  prefetches the next block while the current one computes (``use_stream``).
* ``swap`` (Wan2.2 experts) and ``on_demand`` (text encoders, and denoisers under ``offload_model``): our own
  staging, ``Staged``. Why not diffusers' ``enable_model_cpu_offload``: it moves modules with ``.to()`` both
  ways, so every offload copies unchanged weights back into fresh pageable host memory and every call of the
  pipeline re-uploads both Wan2.2 experts; it also refuses a pipeline that has a group-offloaded component, and
  it offloads the VAE the plan keeps resident. A staged module keeps one host copy of its weights (pinned on
  CUDA: the source of truth while it is off the device); bringing it up is one host->device copy, taking it down
  drops the device copy. A swapped expert stays on the device until another expert needs its place, so the
  expert that ends a run is still resident at the start of the next; with ``plan.prefetch`` (both experts fit)
  the other expert is uploaded on a side stream while the current one computes.
* ``vae_tiling``: diffusers' ``enable_tiling`` on the VAE.

Binding under every plan (``weights_written``/``after_bind``, called by ``loaders.binding``): the patcher writes
each parameter in place, where it lives. Between forwards a group-offloaded module's parameters ARE the tensors
its hooks upload from: with ``use_stream`` diffusers sets ``param.data`` to the pinned CPU snapshot on offload and
copies that snapshot to the GPU on onload (``hooks/group_offloading.py``: ``_offload_to_memory`` /
``_onload_from_memory``), without a stream it moves the module with ``.to``. So a fuse written between forwards
lands in the source of truth and survives every later offload. Injecting or removing peft adapter layers adds
or removes parameters the hooks do not know, so then the hooks are re-created
(``_maybe_remove_and_reapply_group_offloading``, which diffusers provides for exactly this). A staged module that
is on the device when bound has its written tensors copied back to its host copy at once, so dropping the device
copy later loses nothing.

On the CPU, the "device" is the host: every mechanism above still runs (staged copies, group-offload hooks with
onload device cpu), which is how the tests exercise it without a GPU. One CPU detail: tensors loaded from a
safetensors file can start at addresses that are not 64-byte aligned, and the CPU matmul kernels round
differently for the same values at a different alignment (measured: 3.6e-7 on the tiny Wan time embedder). So a
staged "device" copy on the CPU is placed at the same offset modulo 64 bytes as its source, and every plan
computes exactly what ``full`` computes, as on a GPU (where every plan computes on fresh device allocations).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch import nn

from .. import forward_hooks
from ..families.roles import ROLE_VAE
from .file_pages import copy_out_of_files, file_mapped_ranges
from .file_staging import FileStaged
from .planner import default_decode_bytes
from .sizes import DENOISER_ROLES, ENCODER_ROLES
from .staging import CPU, Staged, module_tensors

_VAE_SPATIAL_FACTOR = 8  # latent -> pixels in every supported VAE (Wan, Qwen-Image, MiniMax-H3)


@dataclass
class PlacementStats:
    """Moves made so far (shown in the sampler's report; tests assert the swap policy with them)."""

    uploads: dict = field(default_factory=dict)  # component -> host->device uploads of a staged component
    swaps: int = 0  # expert swaps (an expert brought up while another one was on the device)
    upload_seconds: float = 0.0
    written_back: int = 0  # tensors copied device->host after a bind
    hooks_reapplied: int = 0  # group-offload hooks re-created after adapter layers changed


class ModelPlacement:
    """The live placement of one ``LoadedModel``'s components under one ``MemoryPlan`` on one device."""

    def __init__(self, modules: dict, plan, device: torch.device, roles: dict, weight_sources=None):
        """``roles``: {component: role} from the model's family (``FamilyLayout.component_roles``);
        ``weight_sources``: where weights can be re-read (``lookup(component, key)``), for the components the plan
        keeps in their files (``plan.file_resident``)."""
        self.weight_sources = weight_sources
        self.patch_writer: Optional[Callable[[str], None]] = None  # binding: rewrite a component's patches
        self.modules = {name: m for name, m in modules.items() if isinstance(m, nn.Module)}
        self.plan = plan
        self.device = torch.device(device)
        self.roles = {name: roles.get(name) for name in self.modules}
        # the image VAE: the first VAE of the family's roles, in index order (an audio VAE comes after it)
        self.image_vae = next((n for n, role in roles.items() if role == ROLE_VAE and n in self.modules), None)
        self.placement = {name: plan.placement.get(name, "device") for name in self.modules}
        self.staged: dict[str, Staged] = {}
        self.stats = PlacementStats()
        self.released = False
        self._stream = None
        self._hooked: list = []  # (module, hook name) of each hook placement attached (``forward_hooks``)
        self._offload_params: dict[str, frozenset] = {}  # group-offloaded component -> the tensors its hooks know

    # ------------------------------------------------------------------ applying

    def apply(self, on_progress: Optional[Callable[[int, int], None]] = None) -> None:
        """Put every component where the plan says (reporting ``on_progress(done, total)`` per component)."""
        names = list(self.modules)
        mapped = file_mapped_ranges()  # weights still pages of their file are copied where they stay on the host
        for index, name in enumerate(names):
            module = self.modules[name]
            place = self.placement[name]
            if place in ("device", "blocks") and self.device.type != "cuda":  # on CUDA they leave the host
                copy_out_of_files(module, mapped)
            if place == "device":
                module.to(self.device)
            elif place == "blocks":
                self._enable_group_offload(name, module)
            elif place in ("swap", "on_demand"):
                self.staged[name] = self._stager(name, module)
                self.staged[name].copy_out_of_files(mapped)
                self._install_hooks(name, module)
            if on_progress is not None:
                on_progress(index + 1, len(names))
        vae = self.modules.get(self.image_vae)
        if self.plan.vae_tiling and vae is not None and hasattr(vae, "enable_tiling"):
            vae.enable_tiling()
        self._install_decode_hooks()
        if self.device.type == "cuda" and self.plan.prefetch and len(self._swap_names()) > 1:
            self._stream = torch.cuda.Stream(self.device)

    def _stager(self, name: str, module: nn.Module) -> Staged:
        """A file-backed stager for a component the plan keeps in its file (when its weights can be re-read)."""
        if name in getattr(self.plan, "file_resident", ()) and self.weight_sources is not None:
            return FileStaged(name, module, self.device, self.weight_sources, on_reload=self._reloaded)
        return Staged(name, module, self.device)

    def _reloaded(self, name: str) -> None:
        if self.patch_writer is not None:
            self.patch_writer(name)

    def _enable_group_offload(self, name: str, module: nn.Module) -> None:
        """Block level where the module's repeated blocks are a direct ``ModuleList`` child (diffusers'
        transformers); leaf level otherwise (a transformers text encoder keeps its layers one level down, where
        block level would put the whole encoder in one group)."""
        from diffusers.hooks import apply_group_offloading

        by_blocks = any(isinstance(child, (nn.ModuleList, nn.Sequential)) for child in module.children())
        kwargs = {"offload_type": "block_level", "num_blocks_per_group": 1} if by_blocks else \
            {"offload_type": "leaf_level"}
        apply_group_offloading(module, onload_device=self.device, offload_device=CPU,
                               use_stream=self.device.type == "cuda", **kwargs)
        self._offload_params[name] = frozenset(module_tensors(module))

    def _install_hooks(self, name: str, module: nn.Module) -> None:
        """Bring the staged component up (and its inputs to the device) before each forward; an encoder's phase
        ends with its forward, so it goes down after it (also after a forward that raised)."""
        from accelerate.utils import send_to_device

        def before(mod, _state, args, kwargs):
            self.activate(name)
            return send_to_device(args, self.device), send_to_device(kwargs, self.device)

        def after(mod, _state):
            self.staged[name].drop()

        is_encoder = self.roles.get(name) in ENCODER_ROLES
        self._hook(module, forward_hooks.PLACEMENT_STAGE, before, after if is_encoder else None)

    def _hook(self, module: nn.Module, name: str, before, after=None) -> None:
        forward_hooks.attach(module, name, before=before, after=after)
        self._hooked.append((module, name))

    def _install_decode_hooks(self) -> None:
        """Start the decode phase when a VAE's decoder runs, wherever the decode is called from: the denoising
        phase is over (``end_denoise``) and, on CUDA, the decode's working memory is made room for. Why a hook
        and not a call in the sampler: every family decodes through its own code, and this keeps the plan's
        phases in one place."""
        def before_decoder(mod, _state, args, kwargs):
            self.end_denoise()
            latent = args[0] if args and torch.is_tensor(args[0]) else None
            width, height = (latent.shape[-1], latent.shape[-2]) if latent is not None and latent.dim() >= 4 else (0, 0)
            self.prepare_image_decode(width * _VAE_SPATIAL_FACTOR, height * _VAE_SPATIAL_FACTOR)
            return args, kwargs

        for name, module in self.modules.items():
            decoder = getattr(module, "decoder", None)
            if self.roles.get(name) == ROLE_VAE and isinstance(decoder, nn.Module):
                self._hook(decoder, forward_hooks.PLACEMENT_DECODE, before_decoder)

    # ------------------------------------------------------------------ moving staged components

    def _swap_names(self) -> list[str]:
        return [n for n, p in self.placement.items() if p == "swap"]

    def activate(self, name: str) -> None:
        """Make a staged component usable on the device (a no-op when it is there or not staged).

        A denoiser takes the place of the other denoisers on the device (one expert at a time), except that with
        ``prefetch`` the swapped experts may all stay; bringing one up starts uploading the others then.
        """
        self.ensure_placed()
        staged = self.staged.get(name)
        if staged is None:
            return
        if staged.on_device:
            staged.wait()
            return
        is_denoiser = self.roles.get(name) in DENOISER_ROLES
        evicted = False
        if is_denoiser:
            keep = set(self._swap_names()) if self.plan.prefetch and name in self._swap_names() else set()
            for other_name, other in self.staged.items():
                if other_name != name and other.on_device and other_name not in keep \
                        and self.roles.get(other_name) in DENOISER_ROLES:
                    other.drop()
                    evicted = True
        self._make_room(staged.nbytes, keep=name)
        start = time.perf_counter()
        staged.upload()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # measured as a whole: the swap's cost is this copy
        self.stats.upload_seconds += time.perf_counter() - start
        self.stats.uploads[name] = self.stats.uploads.get(name, 0) + 1
        if evicted:
            self.stats.swaps += 1
        if self.plan.prefetch and name in self._swap_names():
            for other_name in self._swap_names():
                if other_name != name:
                    self.staged[other_name].upload(self._stream)

    def _make_room(self, nbytes: int, keep: str) -> None:
        """On CUDA, drop other staged components (encoders first) until ``nbytes`` fit; a no-op elsewhere."""
        if self.device.type != "cuda":
            return
        order = sorted((n for n, s in self.staged.items() if s.on_device and n != keep),
                       key=lambda n: self.roles.get(n) in DENOISER_ROLES)
        for other in order:
            free, _ = torch.cuda.mem_get_info(self.device)
            if free >= nbytes:
                return
            self.staged[other].drop()

    def end_denoise(self) -> None:
        """After the last step: ``on_demand`` denoisers leave the device (``swap`` experts stay for the next run)."""
        for name, staged in self.staged.items():
            if self.placement[name] == "on_demand" and self.roles.get(name) in DENOISER_ROLES:
                staged.drop()

    def prepare_image_decode(self, width: int, height: int) -> None:
        """``prepare_decode`` with the planner's working-memory estimate for decoding ``width`` x ``height``."""
        self.prepare_decode(default_decode_bytes(width, height) if width and height else 0)

    def prepare_decode(self, nbytes: int = 0) -> None:
        """Before a VAE decode: everything placed, and on CUDA room for ``nbytes`` of decode working memory."""
        self.ensure_placed()
        self._make_room(nbytes, keep=self.image_vae)

    # ------------------------------------------------------------------ binding

    def after_bind(self, written: dict) -> None:
        """Keep a bind under the plan: ``written`` maps a component to the tensors the patcher wrote there.

        Staged components on the device copy those tensors back to their host copy; a component whose set of
        tensors changed (peft adapter layers injected or removed) has its offload bookkeeping re-created."""
        for name, tensors in written.items():
            staged = self.staged.get(name)
            if staged is not None:
                self.stats.written_back += staged.write_back(tensors)
        for staged in self.staged.values():
            staged.refresh()
        for name, known in self._offload_params.items():
            module = self.modules[name]
            if frozenset(module_tensors(module)) != known:
                from diffusers.hooks.group_offloading import _maybe_remove_and_reapply_group_offloading

                _maybe_remove_and_reapply_group_offloading(module)
                self._offload_params[name] = frozenset(module_tensors(module))
                self.stats.hooks_reapplied += 1

    # ------------------------------------------------------------------ giving memory back

    def release(self) -> None:
        """Give the device memory back (ComfyUI's "unload models" / ``/free``): everything goes to the host, with
        its current (possibly fused) values; the next use puts it back (``ensure_placed``)."""
        if self.released or self.device.type == "cpu":
            return
        for name, module in self.modules.items():
            if self.placement[name] == "device":
                module.to(CPU)
        for staged in self.staged.values():
            staged.drop()
        self.released = True

    def ensure_placed(self) -> None:
        if not self.released:
            return
        for name, module in self.modules.items():
            if self.placement[name] == "device":
                module.to(self.device)
        self.released = False

    def remove(self) -> None:
        """Undo the placement's hooks (the model is being dropped or re-placed)."""
        for module, name in self._hooked:
            forward_hooks.detach(module, name)
        self._hooked.clear()
        for staged in self.staged.values():
            staged.drop()
            if isinstance(staged, FileStaged):
                staged.detach()

    # ------------------------------------------------------------------ reporting

    def where(self, name: str) -> str:
        """Where a component's weights are now, in words: ``cuda:0``, ``cpu``, ``cpu (swap)``, ``blocks``..."""
        place = self.placement[name]
        if place == "blocks":
            return f"cpu, streamed to {self.device} by blocks"
        if place in ("swap", "on_demand"):
            where = str(self.device) if self.staged[name].on_device else "cpu"
            return f"{where} ({place})"
        return ("cpu (released)" if self.released else str(self.device)) if place == "device" else "cpu"

    def describe(self) -> dict:
        return {"device": str(self.device), "memory": self.plan.memory, "reason": self.plan.reason,
                "vae_tiling": bool(self.plan.vae_tiling), "prefetch": bool(self.plan.prefetch),
                "components": {name: self.where(name) for name in self.modules}, "swaps": self.stats.swaps,
                "uploads": dict(self.stats.uploads), "upload_seconds": round(self.stats.upload_seconds, 4)}
