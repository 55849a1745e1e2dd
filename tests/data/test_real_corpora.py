"""The real corpora of the tiny recipe through the real fetch and clean steps, with the recipe's
own clean configs: their real defects (GCIDE's invalid UTF-8 and exact duplicates, songci's
duplicate and near-duplicate poems and too-short records, Brown's filtered pages) are counted,
and every source reconciles: in = kept + filtered + duplicates + quarantined, also against
the rows in the files.

Slices keep it fast: the first documents of each source (``max_documents`` of the fetch step),
plus, for GCIDE, every fetched entry that is not valid UTF-8 (entry 18,843 of the recipe's
20,000) so that the real encoding defect is in the slice.
"""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from tests.conftest import TINY
from tidal.context import StepContext
from tidal.data import clean, fetch
from tidal.data.archives import cache_dir

SLICE = {"brown": 60, "gcide": 1500, "songci": 1700, "udhr": 30}


def is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@pytest.fixture(scope="module")
def cleaned(tmp_path_factory):
    """``{source: (rows fed to clean, counts.json, clean out dir)}`` for the tiny recipe's sources."""
    from tidal.core.load import load_pipeline

    tmp = tmp_path_factory.mktemp("real")
    pipe = load_pipeline(TINY, storage_root=str(tmp / "store"))
    out = {}
    for source, n in SLICE.items():
        fetch_config = dict(pipe.graph[f"fetch-{source}"].config)
        archive = fetch_config["archive"]["filename"]
        if not (cache_dir() / archive).is_file():
            pytest.skip(f"{archive} not in the archive cache {cache_dir()} (run `make corpora`)")
        if source != "gcide":  # GCIDE: the recipe's 20,000 entries, sliced below
            fetch_config["max_documents"] = n
        fetch_dir = tmp / f"fetch-{source}"
        fetch_dir.mkdir()
        fetch.run(StepContext("f", f"fetch-{source}", "fetch", fetch_config, fetch_dir))
        raw = pq.read_table(fetch_dir / fetch.RAW_FILE)
        if source == "gcide":
            rows = raw.column("raw").to_pylist()
            keep = [i for i in range(raw.num_rows) if i < n or not is_utf8(rows[i])]
            raw = raw.take(keep)
            fetch.write_parquet(raw, fetch_dir / fetch.RAW_FILE)
        config = pipe.graph[f"clean-{source}"].config
        clean_dir = tmp / f"clean-{source}"
        clean_dir.mkdir()
        clean.run(StepContext("c", f"clean-{source}", "clean", config, clean_dir,
                              inputs={config["input"]: fetch_dir}))
        out[source] = (raw.num_rows, json.loads((clean_dir / clean.COUNTS_FILE).read_text()), clean_dir)
    return out


def test_every_source_reconciles_with_its_input_and_its_files(cleaned):
    for source, (n_in, counts, out) in cleaned.items():
        filtered, quarantined = sum(counts["filtered"].values()), sum(counts["quarantined"].values())
        assert counts["in"] == n_in, source
        assert counts["in"] == counts["kept"] + filtered + counts["duplicates"] + quarantined, source
        docs = sum(pq.read_metadata(p).num_rows for p in sorted(out.glob("documents-*.parquet")))
        removed = pq.read_table(out / clean.REMOVED_FILE).column("outcome").to_pylist()
        assert (docs, removed.count("filtered"), removed.count("duplicate"),
                pq.read_metadata(out / clean.QUARANTINE_FILE).num_rows) == (
            counts["kept"], filtered, counts["duplicates"], quarantined), source
        assert sum(counts["languages"].values()) == counts["kept"], source


def test_the_real_defects_are_counted_under_their_reasons(cleaned):
    gcide, songci, brown = cleaned["gcide"][1], cleaned["songci"][1], cleaned["brown"][1]
    assert gcide["quarantined"]["invalid_utf8"] == 1  # GCIDE's one Windows-1252 byte (0x92)
    quarantine = pq.read_table(cleaned["gcide"][2] / clean.QUARANTINE_FILE).to_pylist()
    assert [(r["ref"], r["reason"]) for r in quarantine] == [("gcide.index:18843", "invalid_utf8")]
    assert not is_utf8(quarantine[0]["raw"])  # kept verbatim
    assert gcide["duplicates_by_kind"]["exact"] > 0  # headwords sharing one definition
    assert songci["duplicates_by_kind"]["exact"] > 0 and songci["duplicates_by_kind"]["near"] > 0
    assert songci["neardup"]["verified_pairs"] >= songci["duplicates_by_kind"]["near"]
    assert songci["filtered"]["too_short"] > 0  # empty and one-line poems
    assert sum(brown["filtered"].values()) > 0 and brown["languages"] == {"en": brown["kept"]}
