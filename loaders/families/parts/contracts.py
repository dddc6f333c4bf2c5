"""``FamilyContracts``: the sampling contracts a family's artifacts and checkpoints declare, and how a request is
resolved against them before any weight moves."""

from __future__ import annotations

from typing import Optional

from ...contracts.schedule_rules import contract_dict
from .bound import FamilyPart


class FamilyContracts(FamilyPart):
    """Defaults: no declared or pinned contract, the slot check as the only artifact rule, no stage rule."""

    def declared_contract(self, file_name: str, metadata: dict, rank: Optional[int], table=None):
        """The ScheduleContract an artifact declares by name/metadata, or None; ContractError if refused.
        ``file_name`` is the file's name with the folder holding it (release layouts keep the step count
        there); ``table`` a matching user contract table entry (``contracts.table.TableEntry``) or None: the
        file's metadata wins over it, and it wins over the name."""
        return None

    def checkpoint_contract(self, model_index: dict, model_name: str):
        """A ScheduleContract pinned by the checkpoint itself (``model_index.json``), or None."""
        return None

    def check_artifact(self, model, file_name: str, component: str) -> None:
        """Refuse a LoRA file made for another kind of model of this family or another slot, before anything is
        fused (Wan: an I2V file on a T2V expert and the reverse, ContractError; a low-noise file in the
        high-noise expert, KeyMatchError): the layout's ``check_slots`` plus the family's own artifact rules."""
        self.family.layout.check_slots(model.model_index, [(component, file_name, "")])

    def contract_to_dict(self, contract) -> dict:
        """JSON-able view of one of this family's contracts (node UI, ``inspect --json``), with a ``text`` line."""
        return contract_dict(contract)

    def resolve_schedule(self, model_handle, contracts: tuple, request):
        """The ResolvedSchedule for a SamplingRequest under ``contracts``; ContractError before any weight moves."""
        raise NotImplementedError

    def refusal_before_loading(self, model_name: str, model_index: dict, contracts: tuple, request) -> Optional[str]:
        """What ``resolve_schedule`` would refuse for certain, told from the model folder's ``model_index.json``
        alone (no weights: a prompt's check before it is queued), or None. None by default: a family whose
        resolution needs the loaded model (MiniMax-H3: its partitions, the task its latent implies) decides when
        it runs."""
        return None

    def on_host(self, contract):
        """The contract as it applies to this family's model held by a host (ComfyUI's own MODEL), which has no
        ``model_index.json``: a contract completed from the host model's defaults. As declared by default."""
        return contract

    def explain_host_sigmas(self, contract, sigmas: list) -> Optional[str]:
        """A better wording than "steps/sigmas" for a host sampler's sigmas off the contract's table (MiniMax-H3:
        the right step count on another flow_shift), or None to keep the general one."""
        return None

    def host_sampling_problem(self, contract, sigmas: list, host_options: dict,
                              condition_keys: frozenset = frozenset()) -> Optional[str]:
        """What else is off the contract in a host sampler run whose sigmas and cfg are right, from the host
        model's own options (ComfyUI's ``transformer_options``) and the keys of its positive conditioning, or None
        (MiniMax-H3: the task the conditioning is for, and the audio schedule its model derives from the video
        sigmas)."""
        return None

    def check_stage(self, model_handle, schedule, enforce: bool) -> list:
        """Refuse a stage (``schedule.start_step``..``stage_end``) the model's artifacts do not allow (ContractError
        naming the artifact and the input), before anything touches a weight; with ``enforce`` off, the override
        lines instead."""
        return []
