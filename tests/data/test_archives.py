"""Archive cache: sha256 pins, re-download of bad cache entries, spec validation, CLI."""

import hashlib
import json

import pytest

from tidal.data import archives
from tidal.data.archives import Archive, ArchiveError, ensure_archive, find_specs

PAYLOAD = b"pinned archive bytes"


def spec_for(data=PAYLOAD, **over):
    spec = {"kind": "npm", "package": "demo-pkg", "version": "1.0.0",
            "sha256": hashlib.sha256(data).hexdigest(), "filename": "demo-pkg-1.0.0.tgz"}
    spec.update(over)
    return spec


def writer(data, calls):
    def download(spec, dest):
        calls.append(spec["package"])
        (dest / spec["filename"]).write_bytes(data)
    return download


def test_download_then_cache_hit(tmp_path):
    calls = []
    path = ensure_archive(spec_for(), tmp_path, writer(PAYLOAD, calls))
    assert path == tmp_path / "demo-pkg-1.0.0.tgz" and path.read_bytes() == PAYLOAD
    assert ensure_archive(spec_for(), tmp_path, writer(PAYLOAD, calls)) == path
    assert calls == ["demo-pkg"]  # second call used the cache
    assert [p.name for p in tmp_path.iterdir()] == ["demo-pkg-1.0.0.tgz"]  # no temp dirs left


def test_mismatch_names_package_and_hashes_and_discards_download(tmp_path):
    spec = spec_for()
    bad = b"tampered"
    with pytest.raises(ArchiveError) as err:
        ensure_archive(spec, tmp_path, writer(bad, []))
    message = str(err.value)
    assert "demo-pkg" in message and spec["sha256"] in message and hashlib.sha256(bad).hexdigest() in message
    assert list(tmp_path.iterdir()) == []


def test_corrupt_cached_file_is_replaced(tmp_path):
    (tmp_path / "demo-pkg-1.0.0.tgz").write_bytes(b"corrupt")
    calls = []
    path = ensure_archive(spec_for(), tmp_path, writer(PAYLOAD, calls))
    assert calls == ["demo-pkg"] and path.read_bytes() == PAYLOAD


def test_cache_dir_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv(archives.CACHE_ENV, str(tmp_path / "c"))
    assert archives.cache_dir() == tmp_path / "c"
    monkeypatch.delenv(archives.CACHE_ENV)
    assert archives.cache_dir().parts[-3:] == (".cache", "tidal", "archives")


@pytest.mark.parametrize("change, rule", [
    ({"kind": "pip"}, "kind"),
    ({"sha256": "ABC"}, "sha256"),
    ({"filename": "../x.tgz"}, "filename must be a bare name"),
    ({"filename": ".."}, "filename must be a bare name"),
    ({"extra": 1}, "extra\n  Extra inputs are not permitted"),
])
def test_bad_specs_are_rejected(change, rule, tmp_path):
    with pytest.raises(ValueError, match=rule):
        Archive.model_validate(spec_for(**change))
    with pytest.raises(ValueError, match=rule):  # before anything is downloaded
        ensure_archive(spec_for(**change), tmp_path, writer(PAYLOAD, []))


def test_missing_key_is_named():
    spec = spec_for()
    del spec["version"]
    with pytest.raises(ValueError, match="version\n  Field required"):
        Archive.model_validate(spec)


def test_find_specs_walks_a_recipe():
    recipe = {"sources": {"a": {"archive": spec_for()},
                          "b": {"archive": spec_for(package="other", filename="other-1.0.0.tgz")}},
              "clean": {"shards": 2}, "again": [spec_for()]}
    assert [s["package"] for s in find_specs(recipe)] == ["demo-pkg", "other"]


def test_cli_uses_cache_and_reports_errors(tmp_path, capsys):
    (tmp_path / "demo-pkg-1.0.0.tgz").write_bytes(PAYLOAD)
    recipe = tmp_path / "r.json"
    recipe.write_text(json.dumps({"sources": {"a": {"archive": spec_for()}}}))
    assert archives.main([str(recipe), "--cache", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "demo-pkg-1.0.0.tgz")
    assert archives.main(["--spec", json.dumps(spec_for(kind="pip")), "--cache", str(tmp_path)]) == 1
    assert "kind" in capsys.readouterr().err


def test_wrong_pin_keeps_the_good_cached_file(tmp_path):
    """A typo in the recipe's sha256 must not destroy a correct cached archive (offline!)."""
    (tmp_path / "demo-pkg-1.0.0.tgz").write_bytes(PAYLOAD)
    wrong = spec_for(sha256="0" * 64)
    with pytest.raises(ArchiveError, match="pin is probably wrong"):
        ensure_archive(wrong, tmp_path, writer(PAYLOAD, []))
    assert (tmp_path / "demo-pkg-1.0.0.tgz").read_bytes() == PAYLOAD


def test_wrong_pin_offline_keeps_cache_and_says_why(tmp_path):
    (tmp_path / "demo-pkg-1.0.0.tgz").write_bytes(PAYLOAD)

    def offline(spec, dest):
        raise ArchiveError("npm pack demo-pkg@1.0.0 failed: network unreachable")

    with pytest.raises(ArchiveError, match="downloading again failed: npm pack"):
        ensure_archive(spec_for(sha256="0" * 64), tmp_path, offline)
    assert (tmp_path / "demo-pkg-1.0.0.tgz").read_bytes() == PAYLOAD
