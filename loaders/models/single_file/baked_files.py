"""What ``lorabind merge`` baked into a single file, read back from its metadata (``_lorabind``, JSON).

Why its own module: the loader (``pipelines``), the contract discovery (``dispatch.contract_discovery``), ``inspect``
and ``extract`` all read it, and none of them should import the merge itself (which imports the offline merge
and, through it, the discovery: an import circle).
"""

from __future__ import annotations

import json

from ...contracts.baked import INDEX_KEY as BAKED_KEY
from .detect import read_metadata

WRITTEN_BY = "lorabind merge"


def baked_file_record(path: str) -> dict:
    """The ``_lorabind`` record a merged single file carries in its metadata ({} for any other file)."""
    text = read_metadata(path).get(BAKED_KEY)
    try:
        record = json.loads(text) if text else {}
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def baked_index_entry(denoisers) -> dict:
    """``{"_lorabind": record}`` for a loaded set's ``model_index``, joining what each merged denoiser file
    carries (``baked_contracts`` turns it into contracts on the model handle, as for a merged folder); {} when
    no file of the set was merged by lorabind."""
    records = [baked_file_record(d.path) for d in denoisers]
    records = [r for r in records if r.get("merged_by")]
    if not records:
        return {}
    return {BAKED_KEY: {"merged_by": WRITTEN_BY,
                        "fused": [entry for r in records for entry in r.get("fused") or ()],
                        "contracts": [entry for r in records for entry in r.get("contracts") or ()]}}
