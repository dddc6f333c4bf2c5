"""Issue 54.7 in the served frontend (1.58.1): a search for "lora" finds the nodes that apply a LoRA first, and
the template cards have a title and a one-line description (1.58's card shows the title; its template search
reads the description; the template's first note shows both when it is opened).

Before: "LoRA on ComfyUI MODEL" (LoraBindLoRA, which nothing in ``serve`` can feed) ranked first, and every node
matched "lora" through its class name (``LoraBind…``), so Save Audio ranked above the Wan2.2 pair; the cards
showed the file stem. The search is the frontend's own (its node-definition store's search service), asked in
the page.
"""

from __future__ import annotations

from test_server_frontend_browser import APP_READY, CHROMIUM, TIMEOUT_MS, pytestmark, sync_playwright  # noqa: F401

from lorabind.runtime.server import ServerConfig
from lorabind.runtime.server.in_process_server import BackgroundServer

SEARCH = """(query) => {
  const stores = document.querySelector('#vue-app').__vue_app__.config.globalProperties.$pinia._s;
  return stores.get('nodeDef').nodeSearchService.searchNode(query).map((definition) => definition.name);
}"""
TEMPLATE_SEARCH_TEXT = """(name) => {
  const stores = document.querySelector('#vue-app').__vue_app__.config.globalProperties.$pinia._s;
  const templates = [...stores.values()].find((store) => store.enhancedTemplates).enhancedTemplates;
  return templates.find((template) => template.name === name).searchableText;
}"""
APPLY_A_LORA = {"FuseDistillLoRA", "WanMoELoRAPair", "LoadPEFTAdapter"}


def test_lora_finds_the_lora_nodes_first_and_the_cards_have_titles(tiny_models_root, tmp_path):
    config = ServerConfig(port=0, models_root=str(tiny_models_root), output_dir=str(tmp_path / "output"),
                          input_dir=str(tmp_path / "input"), temp_dir=str(tmp_path / "temp"))
    with BackgroundServer(config) as server, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(server.url + "/")
        page.wait_for_function(APP_READY, timeout=TIMEOUT_MS)
        found = page.evaluate(SEARCH, "lora")
        page.evaluate("() => { app.extensionManager.command.execute('Comfy.BrowseTemplates'); }")
        dialog = page.wait_for_selector('[role="dialog"]:has-text("Wan2.2 lightx2v 4 steps (start here)")',
                                        timeout=TIMEOUT_MS)
        text = dialog.inner_text()
        searchable = page.evaluate(TEMPLATE_SEARCH_TEXT, "wan22_lightx2v_4step")
        browser.close()
    assert set(found[:3]) == APPLY_A_LORA, found[:12]
    assert found.index("WanMoELoRAPair") < found.index("LoraBindSaveAudio")
    assert not {"LoraBindLoRA", "LoraBindLoRAPair", "LoraBindPEFTAdapter"} & set(found)  # ComfyUI only
    # the cards show titles, not file stems; 1.58's card shows no description, its dialog search reads it
    assert "wan22_lightx2v_4step" not in text and "Wan2.2 image to video, lightx2v" in text
    assert "Wan2.2 A14B with the lightx2v distill pair" in searchable
