"""``lorabind run --parallel``: the command-line options, starting the ranks (ours or torchrun's) and what each
rank does differently (only rank 0 prints and writes where the user looks).

Torch-free at import: ``lorabind --help`` imports the option module through every command's parser.
"""
