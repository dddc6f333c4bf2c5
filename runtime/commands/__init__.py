"""One module per ``lorabind`` subcommand: ``add_arguments(parser)`` and ``run(args) -> exit code``."""

# ``--dtype`` values of merge and extract -> torch dtype attribute names
DTYPE_ARGUMENTS = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
