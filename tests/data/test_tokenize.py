"""Tokenize step: packing, one eos per document, special-token policy, failures, determinism."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from tests.data.builders import CORPUS_WORDS, write_clean_step
from tidal.context import StepContext
from tidal.data import tokenize as tokenize_step
from tidal.data import tokenizer as tokenizer_step
from tidal.data.shards import list_shards, load_token_sequences, token_dtype
from tidal.files.output import OutputDir

EOS = "<|endoftext|>"


def corpus(n: int = 400) -> list[str]:
    words = CORPUS_WORDS
    texts = [
        " ".join(words[(i * 5 + j * 3) % len(words)] for j in range(1 + i % 30)) + f" {i}"
        for i in range(n)
    ]
    return texts + [f"a document that mentions {EOS} literally", f"{EOS}", f"x{EOS}{EOS}y"]


@pytest.fixture(scope="module")
def steps(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tokenize")
    clean = write_clean_step(root / "clean-syn", corpus(), "syn")
    tok = root / "tokenizer"
    tok.mkdir()
    config = {"mode": "train", "vocab_size": 350, "min_frequency": 2, "sources": ["clean-syn"]}
    tokenizer_step.run(
        StepContext("tokenizer-t", "tokenizer", "tokenizer", config, tok, {"clean-syn": clean})
    )
    return {"clean-syn": clean, "tokenizer": tok, "root": root}


def run_tokenize(steps: dict[str, Path], out: Path, seq_len: int = 16, shards: int = 3) -> dict:
    out.mkdir(parents=True)
    config = {
        "source": "syn",
        "input": "clean-syn",
        "tokenizer": "tokenizer",
        "seq_len": seq_len,
        "shards": shards,
    }
    inputs = {"clean-syn": steps["clean-syn"], "tokenizer": steps["tokenizer"]}
    return tokenize_step.run(
        StepContext("tokenize-syn-t", "tokenize-syn", "tokenize", config, out, inputs)
    )


def expected_stream(steps: dict[str, Path]) -> tuple[np.ndarray, int]:
    """The token stream by definition: documents in id order, each + one eos."""
    tokenizer, meta = tokenizer_step.load(steps["tokenizer"])
    table = pa.concat_tables(
        pq.read_table(p) for p in sorted(steps["clean-syn"].glob("documents-*.parquet"))
    )
    rows = sorted(zip(table.column("id").to_pylist(), table.column("text").to_pylist()))
    stream = []
    for _, text in rows:
        stream += tokenizer.encode(text, add_special_tokens=False).ids + [meta["eos_id"]]
    return np.array(stream), len(rows)


def test_pack_sequences_counts_and_tail():
    docs = [np.array([5, 6, 0]), np.array([7, 0]), np.array([8, 9, 10, 0])]
    packed, tail = tokenize_step.pack_sequences(docs, seq_len=4, dtype=np.uint16)
    assert (
        packed.tolist() == [[5, 6, 0, 7], [0, 8, 9, 10]] and tail == 1 and packed.dtype == np.uint16
    )
    packed, tail = tokenize_step.pack_sequences([], seq_len=4, dtype=np.uint16)
    assert packed.shape == (0, 4) and tail == 0
    with pytest.raises(ValueError, match="does not fit in uint16"):
        tokenize_step.pack_sequences([np.array([70000])], seq_len=1, dtype=np.uint16)


def test_step_packs_documents_in_id_order_with_one_eos_each(steps, tmp_path):
    summary = run_tokenize(steps, tmp_path / "out", seq_len=16, shards=3)
    stream, n_docs = expected_stream(steps)
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    tok_meta = json.loads((steps["tokenizer"] / "tokenizer_meta.json").read_text())
    tokenizer, _ = tokenizer_step.load(steps["tokenizer"])
    # a lone byte of a multi-byte character: one symbol that decodes to U+FFFD on its own
    lone_byte = {i for i in set(stream.tolist()) if len(tokenizer.id_to_token(i)) == 1
                 and tokenizer.decode([i]) == "\ufffd"}
    byte_fallback = int(np.isin(stream, sorted(lone_byte)).sum())
    assert meta == {
        "tokenizer_hash": tok_meta["tokenizer_hash"],
        "seq_len": 16,
        "dtype": "uint16",
        "n_sequences": len(stream) // 16,
        "n_tokens": len(stream) // 16 * 16,
        "n_documents": n_docs,
        "vocab_size": tok_meta["vocab_size"],
        "tokens_dropped_tail": len(stream) % 16,
        "documents_failed": 0,
        "encoded_tokens": len(stream) - n_docs,
        "unknown_tokens": 0,
        "byte_fallback_tokens": byte_fallback,
    }

    assert summary["n_sequences"] == meta["n_sequences"]
    shards = list_shards(tmp_path / "out", "tokens", "npy")
    assert [p.name for p in shards] == [f"tokens-0000{i}-of-00003.npy" for i in range(3)]
    sizes = [np.load(p).shape[0] for p in shards]
    assert (
        max(sizes) - min(sizes) <= 1 and sum(sizes) == meta["n_sequences"]
    )  # contiguous, balanced
    tokens = load_token_sequences(
        tmp_path / "out", tokenizer_hash=tok_meta["tokenizer_hash"], seq_len=16
    )
    assert tokens.dtype == np.uint16 and tokens.shape == (meta["n_sequences"], 16)
    assert np.array_equal(tokens.reshape(-1), stream[: meta["n_tokens"]])
    # exactly one eos per document: literal "<|endoftext|>" text never becomes the eos id
    assert int((stream == tok_meta["eos_id"]).sum()) == n_docs
    assert json.loads((tmp_path / "out" / "failed_documents.json").read_text()) == []


def test_rerun_is_byte_identical_and_independent_of_input_sharding(steps, tmp_path):
    run_tokenize(steps, tmp_path / "a")
    run_tokenize(steps, tmp_path / "b")
    resharded = write_clean_step(tmp_path / "clean-3", corpus(), "syn", shards=3)
    run_tokenize({**steps, "clean-syn": resharded}, tmp_path / "c")
    for name in ["meta.json", "failed_documents.json"] + [
        f"tokens-0000{i}-of-00003.npy" for i in range(3)
    ]:
        assert (
            (tmp_path / "a" / name).read_bytes()
            == (tmp_path / "b" / name).read_bytes()
            == (tmp_path / "c" / name).read_bytes()
        ), name


def test_failing_document_is_counted_not_dropped(steps):
    tokenizer, meta = tokenizer_step.load(steps["tokenizer"])
    docs = [("id1", "fine text"), ("id2", "bad \ud800 surrogate"), ("id3", "more text")]
    encoded, failed = tokenize_step.encode_documents(tokenizer, docs, meta["eos_id"])
    assert [doc_id for doc_id, _ in encoded] == ["id1", "id3"]
    assert all(
        ids[-1] == meta["eos_id"] and (ids == meta["eos_id"]).sum() == 1 for _, ids in encoded
    )
    assert [doc_id for doc_id, _ in failed] == ["id2"] and "TypeError" in failed[0][1]


def test_unsorted_document_shard_is_refused(steps, tmp_path):
    bad = tmp_path / "clean-bad"
    bad.mkdir()
    pq.write_table(
        pa.table({"id": ["b", "a"], "text": ["x", "y"], "source": ["s", "s"]}),
        bad / "documents-00000-of-00001.parquet",
    )
    with pytest.raises(ValueError, match=r"documents-00000-of-00001\.parquet: row 1 id 'a'"):
        run_tokenize({**steps, "clean-syn": bad}, tmp_path / "out")


def test_bad_config_is_refused_naming_the_key(steps, tmp_path):
    with pytest.raises(ValidationError, match="seq_len\n  Input should be greater than or equal to 8"):
        run_tokenize(steps, tmp_path / "short", seq_len=4)
    with pytest.raises(ValidationError, match="shards\n  Input should be greater than 0"):
        run_tokenize(steps, tmp_path / "none", shards=0)


def test_dtype_follows_vocab_size():
    assert token_dtype(65535) == np.uint16 and token_dtype(65536) == np.uint32
    assert token_dtype(151669) == np.uint32


@pytest.mark.slow
def test_multi_process_direct_runner_gives_the_same_bytes(steps, tmp_path, monkeypatch):
    run_tokenize(steps, tmp_path / "in_process")
    monkeypatch.setenv(
        "TIDAL_BEAM_ARGS", "--direct_num_workers=2 --direct_running_mode=multi_processing"
    )
    run_tokenize(steps, tmp_path / "two_workers")
    for path in sorted((tmp_path / "in_process").iterdir()):
        assert path.read_bytes() == (tmp_path / "two_workers" / path.name).read_bytes(), path.name


def test_byte_fallback_ids_are_the_lone_bytes_of_unmerged_characters(steps):
    tokenizer, _ = tokenizer_step.load(steps["tokenizer"])
    fallback, unk = tokenize_step.special_token_ids(tokenizer)
    assert unk is None and len(fallback) == 128  # byte-level BPE: bytes 0x80-0xFF, no unknown token
    rare = tokenizer.encode("龘", add_special_tokens=False).ids  # not in the corpus: 3 raw bytes
    assert len(rare) == 3 and set(rare) <= set(fallback)
    ascii_ids = tokenizer.encode("data model", add_special_tokens=False).ids
    assert not set(ascii_ids) & set(fallback)


@pytest.mark.parametrize(("n_docs", "shards_in", "shards_out", "seq_len"), [(0, 2, 2, 4), (1, 1, 3, 5), (57, 3, 2, 7),
                                                                            (200, 4, 5, 16), (900, 3, 7, 5)])
def test_streaming_merge_writes_what_numpy_save_of_the_packed_array_writes(tmp_path, n_docs, shards_in, shards_out,
                                                                           seq_len, monkeypatch):
    """The output shards' writers (each from its own plan, token_writers) against the in-memory reference
    (pack_sequences, then write_token_shards, i.e. np.array_split + np.save): the same bytes in every
    output shard."""
    from tidal.data import token_spill, token_writers
    from tidal.data.shards import write_token_shards

    monkeypatch.setattr(token_writers, "CHUNK_ROWS", 3)  # many flushes, rows split across calls
    monkeypatch.setattr(token_writers, "INDEX_CHUNK", 5)  # index records fetched a few at a time
    monkeypatch.setattr(token_writers, "READ_AHEAD", 64)  # and tokens
    rng = np.random.default_rng(n_docs)
    docs = sorted((f"{rng.integers(1 << 62):064x}"[::-1], rng.integers(0, 60000, rng.integers(1, 40)).astype(np.uint32))
                  for _ in range(n_docs))
    eos = 65000
    docs = [(doc_id, np.append(ids, eos).astype(np.uint32)) for doc_id, ids in docs]
    spills = []
    for k in range(shards_in):  # documents dealt to input shards by id, each shard in id order
        mine = [d for i, d in enumerate(docs) if i % shards_in == k]
        spills.append(token_spill.encode_shard(k, f"shard{k}", OutputDir(tmp_path / "spill"), iter([(mine, [])]),
                                               [], None))
    out = [tmp_path / f"stream-{k}.npy" for k in range(shards_out)]
    merged = token_writers.merge_spills(spills, OutputDir(tmp_path), [p.name for p in out], seq_len,
                                        np.dtype(np.uint16))
    packed, tail = tokenize_step.pack_sequences((ids for _, ids in docs), seq_len, np.uint16)
    (tmp_path / "ref").mkdir()
    names = write_token_shards(tmp_path / "ref", packed, shards_out)
    assert merged == {"n_sequences": packed.shape[0], "tokens_dropped_tail": tail, "n_documents": n_docs}
    for path, name in zip(out, names, strict=True):
        assert path.read_bytes() == (tmp_path / "ref" / name).read_bytes(), name


def test_streaming_merge_refuses_ids_that_do_not_fit_and_repeated_ids(tmp_path):
    from tidal.data import token_spill
    from tidal.data.token_writers import merge_spills

    big = [("a" * 64, np.array([70000, 1], dtype=np.uint32))]
    spill = token_spill.encode_shard(0, "s", OutputDir(tmp_path / "s"), iter([(big, [])]), [], None)
    with pytest.raises(ValueError, match="does not fit in uint16"):
        merge_spills([spill], OutputDir(tmp_path), ["o.npy"], 1, np.dtype(np.uint16))
    doc = [("b" * 64, np.array([1, 2], dtype=np.uint32))]
    twice = [token_spill.encode_shard(k, "s", OutputDir(tmp_path / f"t{k}"), iter([(doc, [])]), [], None)
             for k in (0, 1)]
    with pytest.raises(ValueError, match="appears in two document shards"):
        merge_spills(twice, OutputDir(tmp_path), ["p.npy"], 1, np.dtype(np.uint16))


def test_encode_batches_bound_documents_and_characters(tmp_path):
    import pyarrow as pa

    from tidal.data.fetch import write_parquet

    texts = ["a" * 10, "b" * 300, "c" * 50, "d" * 50, "e" * 50, "f" * 1000, "g" * 5]
    ids = [f"{i:064x}" for i in range(len(texts))]
    path = write_parquet(pa.table({"id": ids, "text": texts}), tmp_path / "documents-00000-of-00001.parquet")
    batches = list(tokenize_step.encode_batches(path, max_documents=3, max_chars=120))
    assert [[doc_id for doc_id, _ in b] for b in batches] == [[ids[0]], [ids[1]], [ids[2], ids[3]], [ids[4]],
                                                               [ids[5]], [ids[6]]]
    assert [t for b in batches for _, t in b] == texts  # every document once, in id order


def test_each_shard_writer_reads_its_own_rows_not_the_corpus(tmp_path, monkeypatch):
    """Issue 38, item 2: the writer of an output shard fetches that shard's tokens (plus a read-ahead
    block per spill) and the index records from the start of one id range, never the whole stream."""
    from tidal.data import token_spill, token_writers
    from tidal.files.step_files import StepFiles

    monkeypatch.setattr(token_writers, "READ_AHEAD", 512)
    monkeypatch.setattr(token_writers, "INDEX_CHUNK", 16)
    rng = np.random.default_rng(5)
    docs = sorted((f"{rng.integers(1 << 62):064x}"[::-1], np.append(rng.integers(0, 60000, rng.integers(1, 60)),
                                                                     65000).astype(np.uint32)) for _ in range(4000))
    spills = [token_spill.encode_shard(k, f"shard{k}", OutputDir(tmp_path / "spill"),
                                       iter([([d for i, d in enumerate(docs) if i % 4 == k], [])]), [], None)
              for k in range(4)]
    fetched: dict[str, int] = {}
    real = StepFiles.read_range

    def counting(self, name, offset, length):
        data = real(self, name, offset, length)
        kind = "index" if name.startswith("index-") else "tokens"
        fetched[kind] = fetched.get(kind, 0) + len(data)
        return data

    monkeypatch.setattr(StepFiles, "read_range", counting)
    seq_len, names = 16, [f"t-{k}.npy" for k in range(8)]
    total_tokens = sum(s["stream_tokens"] for s in spills)
    for task in token_writers.plan_writes(spills, names, seq_len):
        fetched.clear()
        token_writers.write_shard(task, OutputDir(tmp_path / "out"), seq_len, np.dtype(np.uint16))
        own = task["rows"] * seq_len * 4
        assert fetched["tokens"] <= own + 4 * 512 + 4 * 60 * 4, (task["name"], fetched, own)
        assert fetched["tokens"] < total_tokens * 4 / 4  # far from the stream (8 shards)
        # index records: its own documents plus at most one id range before them (4000 / 256 ranges)
        assert fetched["index"] <= (len(docs) / 8 + 3 * len(docs) / 256 + 4 * 16) * 72 * 1.5, fetched


def test_a_spill_in_the_shards_dtype_is_half_the_bytes_and_writes_the_same_shards(tmp_path):
    """Spills in uint16 (a vocabulary under 65,536, the output shards' dtype) hold 2 bytes a token, not 4,
    and the writers read them into the same shard bytes; an id over the dtype is refused while encoding."""
    from tidal.data import token_spill, token_writers

    rng = np.random.default_rng(3)
    docs = sorted((f"{rng.integers(1 << 62):064x}"[::-1],
                   np.append(rng.integers(0, 60000, 30), 65000).astype(np.uint32)) for _ in range(200))
    out = {}
    for dtype in (np.uint32, np.uint16):
        name = np.dtype(dtype).name
        spill = token_spill.encode_shard(0, "s", OutputDir(tmp_path / name), iter([(docs, [])]), [], None,
                                         np.dtype(dtype))
        size = (tmp_path / name / "tokens-00000.bin").stat().st_size
        assert size == spill["stream_tokens"] * np.dtype(dtype).itemsize
        token_writers.merge_spills([spill], OutputDir(tmp_path / f"out-{name}"), ["t.npy"], 7, np.dtype(np.uint16))
        out[name] = (tmp_path / f"out-{name}" / "t.npy").read_bytes()
    assert out["uint16"] == out["uint32"]
    big = [("c" * 64, np.array([70000, 1], dtype=np.uint32))]
    with pytest.raises(ValueError, match="token id 70000 does not fit in uint16"):
        token_spill.encode_shard(0, "s", OutputDir(tmp_path / "big"), iter([(big, [])]), [], None, np.dtype(np.uint16))
