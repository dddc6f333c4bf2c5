"""Issue 44 items 4 and 5: ``serve --lora-path`` as the guides pass it. With the default PEFT backend an absolute
path is accepted under the same confinement rule as a request's ``lora.path`` and what was preloaded is said; with
the distill backend a swapped ``LOW HIGH`` pair refuses to start (exit 2) with the swap message, instead of a
server that answers every request 400 after a failed warm-up."""

from __future__ import annotations

from pathlib import Path

import lorabind
from lorabind.loaders.binding import bind as binding
from lorabind.runtime.commands import serve
from lorabind.tiny_models.lora_fixtures import PEFT_FOLDER, WAN22_HIGH, WAN22_LOW

WAN22_TEMPLATE = Path(lorabind.__file__).parent / "workflows" / "api" / "wan22_tiny_t2v.api.json"


def test_an_absolute_peft_folder_is_preloaded_and_said(tiny_models_root, cache_defaults_restored, capsys, serve_args):
    folder = tiny_models_root / "loras" / PEFT_FOLDER
    args = serve_args("--models", tiny_models_root, "--lora-path", str(folder))
    assert serve.check_openai_arguments(args) is None and serve.apply_adapter_cache_arguments(args) is None
    assert f"lorabind serve: preloaded adapter {PEFT_FOLDER} (" in capsys.readouterr().out
    assert binding._cache_defaults["pinned"] == (str(folder),)


def test_an_allowed_folder_counts_and_anything_outside_is_refused_as_a_request_would_be(
        tiny_models_root, tmp_path, cache_defaults_restored, serve_args):
    import shutil

    mine = tmp_path / "my_adapters"
    shutil.copytree(tiny_models_root / "loras" / PEFT_FOLDER, mine / "style")
    allowed = serve_args("--models", tiny_models_root, "--lora-path", str(mine / "style"), "--allow-lora-dir", str(mine))
    assert serve.apply_adapter_cache_arguments(allowed) is None
    refused = serve.apply_adapter_cache_arguments(serve_args("--models", tiny_models_root, "--lora-path", str(mine / "style")))
    assert refused == f"--lora-path: {str(mine / 'style')!r} is outside the LoRA folders (models/loras and the " \
                      "server's --allow-lora-dir folders)"


def test_a_swapped_distill_pair_refuses_to_start_with_the_swap_message(tiny_models_root, tmp_path, monkeypatch,
                                                                        capsys):
    from lorabind.runtime.cli import main
    from lorabind.runtime.server import app as server_app

    def never(*args, **kwargs):
        raise AssertionError("the server started")

    monkeypatch.setattr(server_app, "warm_up_in_background", lambda *args, **kwargs: None)  # not this test's
    monkeypatch.setattr(server_app.web, "run_app", never)
    code = main(["serve", "--models", str(tiny_models_root), "--port", "0", "--output", str(tmp_path / "out"),
                 "--input", str(tmp_path / "in"), "--temp", str(tmp_path / "temp"),
                 "--openai-model", f"wan={WAN22_TEMPLATE}", "--lora-backend", "distill",
                 "--lora-path", WAN22_LOW, WAN22_HIGH])
    out = capsys.readouterr().out
    assert code == 2
    assert f"lorabind serve: --lora-path {WAN22_LOW} {WAN22_HIGH} for wan: LoRA files in the wrong slots (the pair " \
           "is swapped)" in out
    assert out.rstrip().endswith("give the high-noise file first")
