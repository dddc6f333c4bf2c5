"""Cache keys built from upstream keys (issue 33): each change invalidates exactly the nodes downstream of it, and
nothing that cannot be compared (NaN, objects, cycles) is ever served from the cache."""

from __future__ import annotations

import math

from lorabind.runtime.executor.caching import CacheKey, node_signatures
from lorabind.runtime.executor.definitions import NodeDefinitions
from runtime_fake_nodes import FAKE_NODES

DEFINITIONS = NodeDefinitions(FAKE_NODES)
INTERNED = {}  # one table for every key these tests build, as one executor's cache keeps one


def keys(prompt, is_changed=None):
    return node_signatures(prompt, DEFINITIONS, is_changed or {}, INTERNED)


def chain(seed=3, b=1, slot=0):
    """1 -> 2 -> 3 and 1 -> 4: changing node 2 concerns 2 and 3 only."""
    return {"1": {"class_type": "RtInt", "inputs": {"value": seed}},
            "2": {"class_type": "RtAdd", "inputs": {"a": ["1", slot], "b": b}},
            "3": {"class_type": "RtShow", "inputs": {"value": ["2", 0]}},
            "4": {"class_type": "RtAdd", "inputs": {"a": ["1", 0], "b": 5}}}


def changed(before, after):
    return sorted(node_id for node_id in before if before[node_id] != after[node_id])


def test_a_constant_changes_the_keys_of_its_node_and_everything_downstream_only():
    base = keys(chain())
    assert all(key is not None for key in base.values())
    assert changed(base, keys(chain(b=2))) == ["2", "3"]
    assert changed(base, keys(chain(seed=4))) == ["1", "2", "3", "4"]
    assert keys(chain()) == base  # built again from an equal prompt: equal keys


def test_a_relinked_input_or_a_missing_upstream_node_changes_the_key():
    base = keys(chain())
    assert changed(base, keys(chain(slot=1))) == ["2", "3"]
    relinked = chain()
    relinked["3"]["inputs"]["value"] = ["4", 0]  # 4 and 2 differ by their constant b
    assert changed(base, keys(relinked)) == ["3"]
    missing = chain()
    missing["3"]["inputs"]["value"] = ["9", 0]
    assert keys(missing)["3"] is not None and keys(missing)["3"] != base["3"]


def test_the_same_graph_under_other_node_ids_has_the_same_keys():
    renamed = {f"x{node_id}": {**node, "inputs": {k: [f"x{v[0]}", v[1]] if isinstance(v, list) else v
                                                  for k, v in node["inputs"].items()}}
               for node_id, node in chain().items()}
    assert sorted(keys(renamed).values(), key=repr) == sorted(keys(chain()).values(), key=repr)


def test_nan_is_changed_and_unhashable_constants_are_never_cached_nor_is_anything_downstream():
    base = keys(chain(), {"1": "stamp"})
    nan = keys(chain(), {"2": math.nan})
    assert [nan[n] is None for n in "1234"] == [False, True, True, False]
    assert nan["1"] != base["1"]  # the IS_CHANGED value is part of the key
    odd = chain()
    odd["4"]["inputs"]["b"] = object()
    assert [keys(odd)[n] is None for n in "1234"] == [False, False, False, True]


def test_a_cycle_no_output_reaches_gets_no_key_and_does_not_hang():
    """Validation checks only what the requested outputs reach, so the keys see such cycles."""
    prompt = chain()
    prompt["5"] = {"class_type": "RtAdd", "inputs": {"a": ["6", 0], "b": 1}}
    prompt["6"] = {"class_type": "RtAdd", "inputs": {"a": ["5", 0], "b": 1}}
    prompt["7"] = {"class_type": "RtShow", "inputs": {"value": ["6", 0]}}
    result = keys(prompt)
    assert [result[n] is None for n in "1234567"] == [False] * 4 + [True] * 3
    assert {n: result[n] for n in "1234"} == keys(chain())


def test_a_node_that_is_not_idempotent_keys_on_its_id():
    one = {"1": {"class_type": "RtInt", "inputs": {"value": 1}},
           "2": {"class_type": "RtCounter", "inputs": {"value": ["1", 0]}}}
    other = {"1": one["1"], "8": one["2"]}
    assert keys(one, {"2": 1})["2"] != keys(other, {"8": 1})["8"]
    assert keys(one, {"2": 1})["1"] == keys(other, {"8": 1})["1"]


def plain(key):
    """The nested-tuple key a ``CacheKey`` stands for (its upstream keys expanded), to compare with."""
    if isinstance(key, CacheKey):
        return tuple(plain(part) for part in key.parts)
    if isinstance(key, tuple):
        return tuple(plain(part) for part in key)
    return key


def test_keys_are_equal_exactly_when_their_expanded_tuples_are_and_equal_keys_hash_alike():
    variants = [chain(), chain(b=2), chain(seed=4), chain(slot=1), chain()]
    relinked = chain()
    relinked["3"]["inputs"]["value"] = ["4", 0]
    variants.append(relinked)
    every = [key for prompt in variants for key in keys(prompt).values()]
    for one in every:
        for other in every:
            assert (one == other) is (plain(one) == plain(other))
            assert (one != other) is (plain(one) != plain(other))
            if one == other:
                assert hash(one) == hash(other)
    assert keys(chain())["3"] != plain(keys(chain())["3"])  # a key never equals a bare tuple


class CountedHash:
    calls = 0

    def __hash__(self):
        CountedHash.calls += 1
        return 7


def test_using_a_key_never_hashes_its_parts_nor_its_upstream_tree():
    upstream = CacheKey(("RtInt", False, (("value", CountedHash()),)))
    downstream = CacheKey(("RtShow", False, (("value", ("LINK", upstream, 0)),)))
    lookups = {downstream: "entry", upstream: "up"}
    for _ in range(3):
        assert lookups[downstream] == "entry" and downstream in {downstream} and hash(upstream) == hash(upstream)
    assert CountedHash.calls == 0


def test_an_unchanged_nodes_key_is_the_one_the_cache_holds_and_links_name_it_itself():
    from lorabind.runtime.executor.caching import CacheEntry, OutputCache

    cache = OutputCache()
    first = node_signatures(chain(), DEFINITIONS, {}, cache.interned)
    for node_id, key in first.items():
        cache.put(key, CacheEntry([[node_id]]))
    cache.retain_only(first.values())
    again = node_signatures(chain(b=2), DEFINITIONS, {}, cache.interned)
    assert [node_id for node_id in again if again[node_id] is first[node_id]] == ["1", "4"]
    assert again["2"] != first["2"] and again["3"] != first["3"]
    assert again["2"].parts[2][0][1][1] is first["1"]  # its link holds the upstream key itself
    cache.retain_only(again.values())
    assert set(cache.interned.values()) == set(again.values())
    hits = cache.hits(["4", "3", "2", "1"], again)
    assert list(hits) == ["4", "1"] and hits["4"].outputs == [["4"]]  # in the order asked
    assert node_signatures(chain(), DEFINITIONS, {}, {})["1"] != first["1"]  # keys of another table: never equal
