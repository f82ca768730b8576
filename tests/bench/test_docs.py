"""The bench's --write-docs output must work on the docs site, which serves only docs/."""

from __future__ import annotations

from pathlib import Path

from pyrula_stream.bench.report import DOCS_BEGIN, DOCS_END, docs_plot, refresh_docs


def test_the_docs_link_to_a_copy_of_the_plot_inside_the_docs_folder(tmp_path: Path) -> None:
    results = tmp_path / "bench" / "results"
    results.mkdir(parents=True)
    docs = tmp_path / "docs" / "BENCHMARKS.md"
    docs.parent.mkdir()
    old = results / "2026-01-01T000000Z.png"
    old.write_bytes(b"old plot")
    new = results / "2026-01-02T000000Z.png"
    new.write_bytes(b"new plot")

    docs_plot(old, docs)
    link = docs_plot(new, docs)

    target = (docs.parent / link).resolve()
    assert target.is_relative_to(docs.parent.resolve()), link
    assert target.read_bytes() == b"new plot"
    assert [p.name for p in target.parent.iterdir()] == [new.name]  # only the shown plot
    assert old.exists() and new.exists()  # the results folder keeps every run


def test_refreshing_the_docs_keeps_the_prose_around_the_results(tmp_path: Path) -> None:
    docs = tmp_path / "BENCHMARKS.md"
    docs.write_text(f"# Benchmarks\n\nprose\n\n{DOCS_BEGIN}\nold\n{DOCS_END}\n\nafter\n")
    refresh_docs(docs, f"{DOCS_BEGIN}\nnew\n{DOCS_END}")
    assert docs.read_text() == f"# Benchmarks\n\nprose\n\n{DOCS_BEGIN}\nnew\n{DOCS_END}\n\nafter\n"
