"""One model across several processes on ``torch.distributed``: the ``--parallel`` spec, the process group, the
denoisers' sequence (context) parallelism, the CFG split and the cross-rank check of a binding.

Why a subsystem of its own, at the foundation: the sampling maths (``generation``) splits the guided step across
ranks and the loading sequence (``models``) applies the sequence split, so both read the same session state from
here. ``spec`` is torch-free (the CLI parses ``--parallel`` before torch is imported); everything else imports
``torch.distributed`` and imports diffusers' parallel APIs only when a split is asked for (they exist from 0.36).
Tensor parallelism asks the family for its plan and cuts LoRA deltas per shard, so it sits above the families and
binding, in ``models.tensor_parallel``.
"""
