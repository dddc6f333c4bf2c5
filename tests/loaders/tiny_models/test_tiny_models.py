"""The built-in tiny models: deterministic bytes, no network, the right structure, built on demand."""

import json
import socket

import pytest
from safetensors.torch import load_file

from lorabind.tiny_models import BUILTIN_MODELS, build_tiny, ensure_builtin_models


def _files(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a network connection fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.mark.parametrize("name", sorted(BUILTIN_MODELS))
def test_builders_are_deterministic_and_offline(name, tiny_models_root, tmp_path, no_network):
    rebuilt = build_tiny(tmp_path, names=[name])[0]
    first, second = _files(tiny_models_root / "diffusers" / name), _files(rebuilt)
    assert sorted(first) == sorted(second)
    weight_files = [f for f in first if f.endswith(".safetensors")]
    assert weight_files, "a tiny model must store its weights as safetensors"
    for rel in first:
        assert first[rel] == second[rel], f"{name}/{rel} differs between two builds"
    for rel in weight_files:  # and the tensors themselves are real, finite weights
        tensors = load_file(str(rebuilt / rel))
        assert tensors and all(t.isfinite().all() for t in tensors.values())
    assert sum(len(b) for b in second.values()) < 1_200_000  # small enough to build in every test session


def test_wan22_folder_is_a_two_expert_moe(tiny_models_root):
    index = json.loads((tiny_models_root / "diffusers" / "tiny-wan22-t2v" / "model_index.json").read_text())
    assert index["_class_name"] == "WanPipeline"
    assert index["boundary_ratio"] == 0.875
    assert index["transformer"][1] == index["transformer_2"][1] == "WanTransformer3DModel"
    folder = tiny_models_root / "diffusers" / "tiny-wan22-t2v"
    high = load_file(str(folder / "transformer" / "diffusion_pytorch_model.safetensors"))
    low = load_file(str(folder / "transformer_2" / "diffusion_pytorch_model.safetensors"))
    assert high.keys() == low.keys()
    assert any(not high[k].equal(low[k]) for k in high), "the two experts must have different weights"
    wan21 = json.loads((tiny_models_root / "diffusers" / "tiny-wan21-t2v" / "model_index.json").read_text())
    assert wan21["transformer_2"] == [None, None] and wan21["boundary_ratio"] is None


def test_ensure_builtin_models_builds_only_what_the_prompt_names_and_is_missing(tmp_path):
    prompt = {
        "1": {"class_type": "LoraBindModelLoader", "inputs": {"model_name": "tiny-wan21-t2v", "dtype": "auto"}},
        "2": {"class_type": "LoraBindTextEncode", "inputs": {"model": ["1", 0], "text": "a cat"}},
    }
    assert ensure_builtin_models(prompt, tmp_path) == ["tiny-wan21-t2v"]
    assert sorted(p.name for p in (tmp_path / "diffusers").iterdir()) == ["tiny-wan21-t2v"]
    assert ensure_builtin_models(prompt, tmp_path) == []  # present now: nothing rebuilt


def test_ensure_builtin_models_writes_a_fixture_pair_for_single_files_alone(tmp_path):
    """A prompt naming only tiny single files (here the GGUF experts) and the fixture pair, on an empty models
    root: the files come first, then the pair, shaped from the tiny folders the files were made from."""
    from lorabind.tiny_models.lora_fixtures import WAN22_HIGH, WAN22_LOW

    files = ["lorabind-tiny/wan2.2_t2v_high_noise_tiny_Q8_0.gguf", "lorabind-tiny/wan2.2_t2v_low_noise_tiny_Q8_0.gguf"]
    prompt = {"1": {"class_type": "LoraBindCheckpointLoader", "inputs": {"denoiser": files[0],
                                                                         "denoiser_low_noise": files[1]}},
              "2": {"class_type": "WanMoELoRAPair", "inputs": {"high_noise_lora": WAN22_HIGH,
                                                              "low_noise_lora": WAN22_LOW}}}
    # the pair's shapes come from tiny-wan22-t2v, built first (the single files would have built it anyway)
    assert ensure_builtin_models(prompt, tmp_path) == ["tiny-wan22-t2v", *files, WAN22_HIGH, WAN22_LOW]
    assert all((tmp_path / "loras" / name).is_file() for name in (WAN22_HIGH, WAN22_LOW))


def test_a_fixture_named_without_its_tiny_model_gets_that_model_built_first(tmp_path):
    """Issue 57: the VACE example names the Wan2.1 T2V fixture LoRA but not tiny-wan21-t2v, whose shapes it takes;
    on a fresh models folder (ComfyUI's first queue of the template) the LoRA was never written."""
    from lorabind.tiny_models.lora_fixtures import WAN21_DISTILL

    prompt = {"1": {"class_type": "LoraBindModelLoader", "inputs": {"model_name": "tiny-wan21-vace"}},
              "2": {"class_type": "FuseDistillLoRA", "inputs": {"model": ["1", 0], "lora_name": WAN21_DISTILL}}}
    assert ensure_builtin_models(prompt, tmp_path) == ["tiny-wan21-t2v", "tiny-wan21-vace", WAN21_DISTILL]
    assert (tmp_path / "loras" / WAN21_DISTILL).is_file()


def test_build_tiny_rejects_unknown_names(tmp_path):
    with pytest.raises(KeyError, match="tiny-wan99"):
        build_tiny(tmp_path, names=["tiny-wan99"])


def test_qwen_tokenizer_system_prefix_has_the_length_the_pipeline_drops(load_tiny):
    from lorabind.tiny_models.tokenizers import QWEN_PROMPT_TEMPLATE, QWEN_TEMPLATE_PREFIX_TOKENS

    pipeline = load_tiny("tiny-qwen-image").pipeline
    assert pipeline.prompt_template_encode_start_idx == QWEN_TEMPLATE_PREFIX_TOKENS
    tokenizer = pipeline.tokenizer
    tokens = tokenizer.convert_ids_to_tokens(tokenizer(QWEN_PROMPT_TEMPLATE.format("a cat"))["input_ids"])
    prompt_start = tokens.index("<|im_start|>", 1) + 3  # "<|im_start|>", "user", "\n" open the user turn
    assert prompt_start == QWEN_TEMPLATE_PREFIX_TOKENS
    assert tokens[prompt_start] == "a" and tokens[prompt_start + 2] == "<|im_end|>"


@pytest.mark.parametrize("name", sorted(BUILTIN_MODELS))
def test_tokenizers_are_saved_in_a_form_transformers_4_and_5_both_read(name, tiny_models_root):
    """transformers 5 saves a fast tokenizer as "TokenizersBackend", which transformers 4.57 does not know."""
    folder = tiny_models_root / "diffusers" / name
    index = json.loads((folder / "model_index.json").read_text())
    assert index["tokenizer"] == ["transformers", "PreTrainedTokenizerFast"]
    config = json.loads((folder / "tokenizer" / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert "TokenizersBackend" not in json.dumps(index) + json.dumps(config)
    assert set(index["_lorabind_built_with"]) == {"torch", "diffusers", "transformers"}


def test_a_tiny_model_built_by_other_library_versions_is_rebuilt_and_said_so(tiny_models_root, tmp_path, caplog):
    import shutil

    from lorabind.tiny_models import needs_build

    folder = tmp_path / "diffusers" / "tiny-wan21-t2v"
    shutil.copytree(tiny_models_root / "diffusers" / "tiny-wan21-t2v", folder)
    assert not needs_build(folder)
    index = json.loads((folder / "model_index.json").read_text())
    index["_lorabind_built_with"]["transformers"] = "4.57.0"
    (folder / "model_index.json").write_text(json.dumps(index))
    with caplog.at_level("WARNING", logger="lorabind.tiny_models"):
        assert needs_build(folder)
    assert "rebuilding the built-in tiny model tiny-wan21-t2v" in caplog.text and "transformers 4.57.0 ->" in caplog.text
    del index["_lorabind_built_with"]
    (folder / "model_index.json").write_text(json.dumps(index))
    assert needs_build(folder)


@pytest.mark.parametrize("name", ["tiny-qwen-image-edit", "tiny-qwen-image-edit-plus"])
def test_qwen_edit_tokenizer_drops_exactly_the_system_prefix_and_keeps_the_vision_tokens(load_tiny, name):
    """QwenImageEdit(Plus)Pipeline drops the first 64 tokens of its edit template; with the tiny tokenizer those are
    the system turn and "<|im_start|>user\\n", so the picture tokens and the instruction are what is kept. Each
    ``<|image_pad|>`` is one token the processor expands to the image's merged patch count."""
    from PIL import Image

    from lorabind.tiny_models.tokenizers import QWEN_EDIT_PREFIX_TOKENS

    pipeline = load_tiny(name).pipeline
    assert pipeline.prompt_template_encode_start_idx == QWEN_EDIT_PREFIX_TOKENS == 64
    # Edit's template holds the picture tokens itself; Plus puts "Picture N: ..." before the instruction
    picture = "Picture 1: <|vision_start|><|image_pad|><|vision_end|>" if name.endswith("plus") else ""
    prompt = pipeline.prompt_template_encode.format(picture + "a cat")
    inputs = pipeline.processor(text=[prompt], images=[Image.new("RGB", (56, 84))], padding=True, return_tensors="pt")
    tokens = pipeline.processor.tokenizer.convert_ids_to_tokens(inputs["input_ids"][0].tolist())
    assert tokens[QWEN_EDIT_PREFIX_TOKENS - 3: QWEN_EDIT_PREFIX_TOKENS] == ["<|im_start|>", "user", "Ċ"]
    pads = tokens.count("<|image_pad|>")
    assert pads == int(inputs["image_grid_thw"][0].prod()) // 4 and pads > 1
    assert "<|vision_start|>" in tokens and tokens[-7:-5] == ["a", "Ġcat"]  # then <|im_end|>, the assistant turn
