"""Every results file in bench/results/ has a machine-readable .json twin (the developers' guide), and the
Markdown-table twin of older results parses figures as stated."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]


def load_md_twin():
    spec = importlib.util.spec_from_file_location("md_twin", ROOT / "bench" / "md_twin.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_results_markdown_has_a_json_twin():
    results = sorted((ROOT / "bench" / "results").glob("*.md"))
    assert results
    missing = [p.name for p in results if not p.with_suffix(".json").is_file()]
    assert not missing, f"results without a .json twin: {missing} (bench/md_twin.py writes one from the tables)"
    for path in results:
        assert isinstance(orjson.loads(path.with_suffix(".json").read_bytes()), dict)


def test_markdown_tables_become_rows_with_numbers():
    md_twin = load_md_twin()
    text = ("# Title\n\nintro\n\n## Speed\n\n| config | tokens/s | vs one | share | note |\n|---|---|---|---|---|\n"
            "| one | 1,234.5 | **1.00x** | 12.5% | fine |\n| shards | 56 | 0.76x | -3 | 2 x 1 |\n\ntext after\n")
    (table,) = md_twin.tables(text)
    assert table["section"] == "Speed" and table["columns"] == ["config", "tokens/s", "vs one", "share", "note"]
    assert table["rows"] == [
        {"config": "one", "tokens/s": 1234.5, "vs one": 1.0, "share": 12.5, "note": "fine"},
        {"config": "shards", "tokens/s": 56, "vs one": 0.76, "share": -3, "note": "2 x 1"}]
    assert md_twin.cell_value("(stopped)") == "(stopped)" and md_twin.cell_value("1e-5") == 1e-5
