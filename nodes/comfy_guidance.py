"""Where a ComfyUI sampler applies guidance, read for the contract check: its guider, its step rule, its model
options' guidance hooks and its conditioning, before the first step and again at every step.

Why here and not only in ``comfy_bridge``'s spirit of "read ``guider.cfg`` once": the guidance a ComfyUI run
applies is decided by the guider object and by wrappers that run around each prediction. ``DualCFGGuider`` keeps
``cfg`` at 1 and samples with its own two scales; ``CFGOverride`` sets ``guider.cfg`` at each step inside a
predict-noise wrapper, after any check made before sampling; ``CFGNorm`` and its like replace or post-process the
guided prediction through model-option hooks. So the check runs where the guidance is applied: an outer-sample
wrapper reads the whole run before the first step (trying ``CFGOverride``'s wrappers over every sigma without
running the model), and the guider's own ``predict_noise`` is wrapped for the run, innermost, so every step's
guidance is read as the guider is about to apply it, whatever set it. A guider class this module does not know is
reported as unreadable, which the use case refuses by name. Imported only inside ComfyUI (the native nodes'
``add_sample_check``); ComfyUI's own modules are imported lazily.
"""

from __future__ import annotations

import importlib
import math
import re

from ..usecases.vocabulary import HostGuidance, HostRun

# The guider classes ComfyUI ships, by (class name, the module file it is defined in), with the node that makes
# each: a class of that name from another module (a custom pack's) is not one of these and is not trusted.
_CORE_GUIDERS = {
    ("CFGGuider", "samplers"): "CFGGuider",  # KSampler, KSamplerAdvanced and SamplerCustom make one too
    ("Guider_Basic", "nodes_custom_sampler"): "BasicGuider",
    ("Guider_DualCFG", "nodes_custom_sampler"): "DualCFGGuider",
    ("Guider_DualModel", "nodes_custom_sampler"): "DualModelGuider",
    ("Guider_PerpNeg", "nodes_perpneg"): "PerpNegGuider",
}
# Predict-noise wrappers known to change nothing but ``guider.cfg`` (CFGOverride's): the run's check tries them over
# every sigma before the first step. Any other wrapper is met at each step by the innermost check.
_CFG_SETTING_WRAPPERS = {("CFGOverride.execute.<locals>.predict_noise_wrapper", "nodes_custom_sampler")}
# The model-option entries through which a node changes the guided prediction (comfy/samplers.py cfg_function and
# sampling_function; a guider of its own calls the same ones).
_GUIDANCE_HOOKS = ("sampler_cfg_function", "sampler_pre_cfg_function", "sampler_post_cfg_function",
                   "sampler_calc_cond_batch_function")


def _file_stem(module_name: str) -> str:
    """ComfyUI names its comfy_extras modules by file path (``.../comfy_extras/nodes_perpneg``): the last part."""
    return re.split(r"[./\\]", module_name or "")[-1]


def _identity(obj) -> tuple:
    """(qualified name, module file stem) of a class or function: what the tables above are keyed by."""
    return (getattr(obj, "__qualname__", type(obj).__qualname__),
            _file_stem(getattr(obj, "__module__", type(obj).__module__)))


def read_guidance(guider, model_options: dict) -> HostGuidance:
    """What ``guider`` applies with ``model_options`` at this moment (its scales, and the hooks that change it)."""
    node = _CORE_GUIDERS.get(_identity(type(guider)))
    hooks = _hook_names(model_options)
    if node is None:
        return HostGuidance(f"{type(guider).__qualname__} (from {_file_stem(type(guider).__module__)})",
                            unreadable=True, hooks=hooks)
    if node == "DualCFGGuider":
        return _dual_cfg(guider, hooks)
    cfg = float(getattr(guider, "cfg", 1.0))
    if node == "PerpNegGuider":
        neg_scale = float(getattr(guider, "neg_scale", 0.0))
        # with neg_scale 0 its perpendicular term vanishes and it is cfg against the empty prompt
        return HostGuidance(node, (("cfg", cfg), ("neg_scale", neg_scale)),
                            cfg if math.isclose(neg_scale, 0.0, abs_tol=1e-9) else None, hooks=hooks)
    return HostGuidance(node, (("cfg", cfg),), cfg, hooks=hooks)


def _dual_cfg(guider, hooks: tuple) -> HostGuidance:
    """DualCFGGuider: ``cfg_conds`` between cond1 and cond2, ``cfg_cond2_negative`` between cond2 and the
    negative. With the second at 1 either style is plain cfg ``cfg_conds`` (cond2 as the negative); otherwise it
    is no single cfg."""
    first, second = float(guider.cfg1), float(guider.cfg2)
    style = "nested" if getattr(guider, "nested", False) else "regular"
    scales = (("cfg_conds", first), ("cfg_cond2_negative", second), ("style", style))
    return HostGuidance("DualCFGGuider", scales, first if math.isclose(second, 1.0) else None, hooks=hooks)


def _hook_names(model_options: dict) -> tuple:
    """Each guidance hook in the model options, named by the node that added it where its name says so:
    ``CFGNorm's sampler_post_cfg_function (cfg_norm)``."""
    names = []
    for entry in _GUIDANCE_HOOKS:
        functions = (model_options or {}).get(entry)
        for function in functions if isinstance(functions, (list, tuple)) else [functions] if functions else []:
            qualname = getattr(function, "__qualname__", type(function).__qualname__)
            owner, _, rest = qualname.partition(".")
            names.append(f"{owner}'s {entry} ({rest.rpartition('.')[2] or owner})" if rest else f"{entry} {owner}")
    return tuple(names)


def sampler_name(sampler) -> str:
    """ComfyUI's name of a sampler object's step rule: ``euler`` for ``KSAMPLER(sample_euler)`` (``ddim`` is that
    too), ``dpmpp_2m``...; a stochastic euler (``s_churn`` set) is not euler. An object that is no ``KSAMPLER`` is
    named by its class: a rule we cannot read is never taken for the contract's."""
    function = getattr(sampler, "sampler_function", None)
    if function is None:
        return type(sampler).__name__
    name = getattr(function, "__name__", "")
    name = name.removeprefix("sample_") if name.startswith("sample_") else name or type(sampler).__name__
    churn = (getattr(sampler, "extra_options", None) or {}).get("s_churn", 0.0)
    return f"{name} (s_churn {churn:g})" if churn else name


def condition_keys(guider) -> frozenset:
    """The keys of the guider's positive conditioning (what the task is: MiniMax-H3's references, keyframes)."""
    conds = (getattr(guider, "original_conds", None) or {}).get("positive") or ()
    return frozenset(key for cond in conds if isinstance(cond, dict) for key in cond)


def sampler_run(guider, sampler, sigmas, guidance) -> HostRun:
    """The run as the use case checks it; ``guidance`` None when it is known only step by step."""
    options = getattr(guider, "model_options", None) or {}
    return HostRun(tuple(float(s) for s in sigmas.flatten().tolist()), guidance, sampler_name(sampler),
                   dict(options.get("transformer_options") or {}), condition_keys(guider))


def guidance_at_each_sigma(guider, sigmas) -> list | None:
    """``(sigma, guidance)`` of every step, read before the first one by passing each sigma through the guider's
    predict-noise wrappers with a stand-in for the model (which records what the guider holds when it would
    predict): only when every wrapper is one that merely sets cfg, so nothing else runs. [] when there is no
    wrapper (every step applies what the guider holds now); None when a wrapper is one we do not know (each step's
    guidance is then read as it comes)."""
    patcher_extension = importlib.import_module("comfy.patcher_extension")
    wrappers = patcher_extension.get_all_wrappers(patcher_extension.WrappersMP.PREDICT_NOISE,
                                                  guider.model_options, is_model_options=True)
    if not wrappers:
        return []
    if not all(_identity(wrapper) in _CFG_SETTING_WRAPPERS for wrapper in wrappers):
        return None
    import torch

    seen = []

    def stand_in(x, timestep, model_options={}, seed=None):  # noqa: B006 (the guider's own signature)
        seen.append((float(timestep.flatten()[0]), read_guidance(guider, model_options)))

    for sigma in sigmas.flatten().tolist()[:-1]:
        executor = patcher_extension.WrapperExecutor.new_class_executor(stand_in, guider, wrappers)
        executor.execute(None, torch.tensor([float(sigma)]), guider.model_options, None)
    return seen


def add_sample_check(model, key: str, check_run, check_step) -> None:
    """Check every ComfyUI sampler run of ``model`` (KSampler, KSamplerAdvanced, SamplerCustom(Advanced), any
    guider): ``check_run(HostRun)`` before any model is loaded or step is taken, ``check_step(HostGuidance,
    sigma)`` for every step's guidance as the guider is about to apply it. Raising fails the sampler node with our message.
    One wrapper per ``key``."""
    wrappers = importlib.import_module("comfy.patcher_extension").WrappersMP

    def outer_sample(executor, noise, latent_image, sampler, sigmas, *args, **kwargs):
        guider = executor.class_obj
        steps = guidance_at_each_sigma(guider, sigmas)
        now = read_guidance(guider, guider.model_options) if steps == [] else None
        check_run(sampler_run(guider, sampler, sigmas, now))
        for sigma, guidance in steps or ():
            check_step(guidance, sigma)
        own = vars(guider).get("predict_noise")  # an instance's own predict_noise (another pack's), if any
        predict = guider.predict_noise

        def checked_predict_noise(x, timestep, model_options={}, seed=None):  # noqa: B006 (ComfyUI's signature)
            check_step(read_guidance(guider, model_options), float(timestep.flatten()[0]))
            return predict(x, timestep, model_options, seed)

        guider.predict_noise = checked_predict_noise  # innermost: after every predict-noise wrapper has run
        try:
            return executor(noise, latent_image, sampler, sigmas, *args, **kwargs)
        finally:
            if own is None:
                del guider.predict_noise  # the class's own again
            else:
                guider.predict_noise = own

    model.remove_wrappers_with_key(wrappers.OUTER_SAMPLE, key)
    model.add_wrapper_with_key(wrappers.OUTER_SAMPLE, key, outer_sample)
