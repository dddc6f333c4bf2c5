"""The pack's ``pyproject.toml`` as the Comfy Registry and ComfyUI-Manager take it: read the way comfy-cli's config
parser reads it (``comfy_cli/registry/config_parser.py``: ``extract_node_configuration``), with the fields the
registry requires checked as its publish step and its specification check them (the node id's grammar, an
X.Y.Z version, a publisher id, a repository, a license in one of the two accepted forms, an icon URL).
"""

import re
from pathlib import Path
from urllib.parse import urlparse

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[1]
# comfy-cli's URLs: the [project.urls] keys it maps (any other key, e.g. "Bug Tracker", is not read)
URL_KEYS = {"homepage": "Homepage", "documentation": "Documentation", "repository": "Repository", "issues": "Issues"}
NODE_ID = re.compile(r"[A-Za-z][A-Za-z0-9]*([-_.][A-Za-z0-9]+)*")  # the registry's node-id rules
SEMVER = re.compile(r"\d+\.\d+\.\d+(-[A-Za-z0-9]+)?")  # comfy-cli's validate_version, without the operator


def registry_view(pyproject: Path) -> dict:
    """What comfy-cli's parser makes of the file: project fields, the mapped URLs, the license (a string is its
    text; a table needs ``file`` or ``text``, otherwise it is dropped with a warning) and the [tool.comfy] entry."""
    data = tomllib.loads(pyproject.read_text(encoding="utf-8-sig"))
    project = data.get("project", {})
    comfy = data.get("tool", {}).get("comfy", {})
    license_data = project.get("license", {})
    if isinstance(license_data, str):
        license_data = {"text": license_data}
    elif not (isinstance(license_data, dict) and ({"file", "text"} & set(license_data))):
        license_data = {}
    urls = project.get("urls", {})
    return {"name": project.get("name", ""), "version": str(project.get("version", "")).strip(),
            "description": project.get("description", ""), "license": license_data,
            "urls": {field: urls.get(key, "") for field, key in URL_KEYS.items()},
            "publisher_id": comfy.get("PublisherId", ""), "display_name": comfy.get("DisplayName", ""),
            "icon": comfy.get("Icon", ""), "includes": comfy.get("includes", [])}


@pytest.fixture(scope="module")
def entry() -> dict:
    return registry_view(ROOT / "pyproject.toml")


def test_the_fields_publishing_requires_are_set(entry):
    assert entry["publisher_id"] and entry["name"]  # comfy-cli refuses to publish without either
    assert NODE_ID.fullmatch(entry["name"]) and len(entry["name"]) < 100 and "comfyui" not in entry["name"].lower()
    assert SEMVER.fullmatch(entry["version"]), entry["version"]
    assert entry["description"] and entry["display_name"]


def test_every_url_comfy_cli_maps_is_an_https_url(entry):
    for field, url in entry["urls"].items():
        parsed = urlparse(url)
        assert parsed.scheme == "https" and parsed.netloc, (URL_KEYS[field], url)
    assert entry["urls"]["issues"].startswith(entry["urls"]["repository"])


def test_the_icon_is_a_url_to_a_file_of_this_repository(entry):
    """The registry's spec asks for an icon URL (a relative path is no icon there); ours is the repository's raw
    ``web/icon.svg``, which must exist."""
    icon = urlparse(entry["icon"])
    assert icon.scheme == "https" and icon.netloc, entry["icon"]
    owner_repo = urlparse(entry["urls"]["repository"]).path.strip("/")
    prefix = f"/{owner_repo}/main/"
    assert icon.netloc == "raw.githubusercontent.com" and icon.path.startswith(prefix), entry["icon"]
    assert (ROOT / icon.path[len(prefix):]).is_file()


def test_the_license_is_declared_and_the_license_file_is_that_license(entry):
    assert entry["license"] == {"text": "Apache-2.0"}
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert re.match(r"\s*Apache License\s+Version 2\.0, January 2004", text)
    assert "END OF TERMS AND CONDITIONS" in text


def test_the_readme_says_how_to_install_from_comfyui_manager_and_comfy_cli_by_the_registry_node_id():
    """Issue 54: the README named only the git clone; ComfyUI users install from the Manager or comfy-cli, by the
    registry's node id (the project name)."""
    node_id = registry_view(ROOT / "pyproject.toml")["name"]
    for page in (ROOT / "README.md", ROOT / "docs" / "comfyui" / "installing.md"):
        text = " ".join(page.read_text(encoding="utf-8").split())
        assert f"`comfy node install {node_id}`" in text and "ComfyUI-Manager" in text, page
        assert f"search for `{node_id}`" in text and f"node id `{node_id}`" in text, page
        # the clone command stays as it was
        assert "cd ComfyUI/custom_nodes && git clone <this repository> lorabind && pip install -r " in text
