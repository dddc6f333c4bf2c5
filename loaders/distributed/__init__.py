"""Running one model across several processes on ``torch.distributed``: how ranks are launched and grouped, and
how a denoiser is split among them (sequence, CFG and tensor parallelism), with LoRA binding exact on every rank.
The engine side only: nothing here launches processes from a graph or a server."""
