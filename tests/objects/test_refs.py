"""References without a broker: the local store's keys, the offload rule, the resolver's
errors, and the sweeper's grace."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pyrula_stream.errors import ConfigurationError, PayloadTooLarge, PayloadUnresolved
from pyrula_stream.objects import LocalObjectStore, PayloadStores, open_store
from pyrula_stream.objects.sweep import sweep
from pyrula_stream.wire.payload_refs import Offload, PayloadRef, is_ref, refs_in


@pytest.fixture
def store(tmp_path: Path) -> LocalObjectStore:
    return LocalObjectStore(tmp_path / "objects")


@pytest.mark.parametrize("key", ["../escape", "/etc/passwd", "a//b", "a/./b", "a/../../b", ""])
def test_a_key_that_could_leave_the_root_is_refused(store: LocalObjectStore, key: str) -> None:
    with pytest.raises(ConfigurationError, match="not a plain relative path"):
        store.put(key, b"x", "application/json")


def test_the_local_store_puts_gets_lists_and_deletes_twice(store: LocalObjectStore) -> None:
    store.put("p/ab/abc", b"hello", "application/json")
    store.put("p/ab/abc", b"hello", "application/json")  # a rerun: same key, one object
    assert store.get("p/ab/abc") == b"hello"
    assert [(i.key, i.size) for i in store.list("p/")] == [("p/ab/abc", 5)]
    assert list(store.list("q/")) == []
    store.delete("p/ab/abc")
    store.delete("p/ab/abc")
    with pytest.raises(KeyError):
        store.get("p/ab/abc")
    assert open_store(f"file://{store.root}").root == store.root


def test_small_values_stay_and_big_parts_leave_by_content_address(store: LocalObjectStore) -> None:
    offload = Offload("local", threshold=1000, prefix="p/")
    small = {"q": "x" * 10}
    assert offload.apply(small, "a value") == (small, [])
    value = {"q": "short", "doc": "D" * 5000, "parts": ["P" * 600, "Q" * 600]}
    out, stored = offload.apply(value, "a value")
    assert out["q"] == "short" and is_ref(out["doc"])
    assert len(json.dumps(out)) < 1000
    _, stored_again = offload.apply(value, "a value")
    assert [s.ref for s in stored_again] == [s.ref for s in stored]  # a rerun: same keys
    payloads = PayloadStores([store])
    payloads.put(stored)
    assert payloads.resolve(out) == value
    assert {r.key for r in refs_in(out)} <= {s.ref.key for s in stored}


def test_a_value_past_the_agents_maximum_names_the_limit() -> None:
    offload = Offload("local", threshold=100, max_bytes=1000)
    with pytest.raises(PayloadTooLarge, match="max_payload_bytes=1000") as info:
        offload.apply({"doc": "D" * 2000}, "the result of turn t1")
    assert "the result of turn t1" in str(info.value)


def test_a_missing_or_altered_object_or_an_unknown_store_is_a_clear_error(
    store: LocalObjectStore,
) -> None:
    offload = Offload("local", threshold=300, prefix="p/")
    out, stored = offload.apply({"doc": "D" * 1000}, "a value")
    [value] = stored
    payloads = PayloadStores([store])
    with pytest.raises(PayloadUnresolved, match=f"{value.ref.key} in object store 'local'"):
        payloads.resolve(out)
    store.put(value.ref.key, b'"altered"', "application/json")
    with pytest.raises(PayloadUnresolved, match="sha256 differs") as info:
        payloads.resolve(out)
    assert value.ref.key in str(info.value) and "'local'" in str(info.value)
    elsewhere = PayloadRef("s3", value.ref.key, value.ref.size, value.ref.sha256).data()
    with pytest.raises(PayloadUnresolved, match="object store 's3'"):
        payloads.resolve({"doc": elsewhere})


def test_the_sweeper_keeps_young_and_referenced_objects_and_runs_twice(
    store: LocalObjectStore,
) -> None:
    for name in ("old-live", "old-orphan", "young-orphan"):
        store.put(f"p/xx/{name}", b"1", "application/json")
    for name in ("old-live", "old-orphan"):  # written two hours ago
        path = store.path(f"p/xx/{name}")
        past = path.stat().st_mtime - 7200
        os.utime(path, (past, past))
    report = sweep(store, "p/", lambda: {"old-live"}, grace_s=3600)
    assert report.deleted == ["p/xx/old-orphan"]
    assert (report.listed, report.referenced, report.young) == (3, 1, 1)
    assert sweep(store, "p/", lambda: {"old-live"}, grace_s=3600).deleted == []
    assert sorted(i.key for i in store.list()) == ["p/xx/old-live", "p/xx/young-orphan"]


def test_a_sweep_reports_what_it_deleted_to_the_metric(store: LocalObjectStore) -> None:
    from pyrula_stream.observability.metrics import WorkerMetrics

    store.put("p/xx/orphan", b"1", "application/json")
    metrics = WorkerMetrics("a", journal_topic="j", dlq_topic="d")
    sweep(store, "p/", set, grace_s=0, now_ms=lambda: 1 << 62, on_deleted=metrics.swept_objects)
    assert metrics.registry.get_sample_value("pyrula_objects_swept_total", {"agent": "a"}) == 1
