"""The use-case layer: what the hosts (ComfyUI nodes, ``lorabind run``, ``lorabind serve``) ask of the engine.

Why: the rules that are neither a node's declaration nor engine mechanics (which denoiser a file goes to, the
sampler's order of checks, composing a contract, listing and resolving models, finding tokenizers) live here once,
so every host runs them the same way. Nodes import two modules of it, never the engine's: ``usecases.verbs`` (what
they call) and ``usecases.vocabulary`` (socket types, input choices, records and errors they declare and pass).

This ``__init__`` imports nothing, on purpose: the CLI's fast start imports ``usecases.host`` and
``usecases.model_folders`` (torch-free), and Python runs a package's ``__init__`` before any submodule, so a facade
here would load torch for ``lorabind --help``.
"""
