"""``lorabind run --parallel`` and ``serve --parallel``: the command-line options, starting the ranks (ours or
torchrun's), what each rank does differently (only rank 0 prints and writes where the user looks), and for a
served job the channel through which rank 0 hands each prompt to the others.

Torch-free at import: ``lorabind --help`` imports the option module through every command's parser.
"""
