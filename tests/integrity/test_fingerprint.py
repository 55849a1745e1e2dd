"""The environment fingerprint: real installed versions, diffs name what changed."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata

from tidal.integrity.fingerprint import environment_fingerprint, fingerprint_diff


def test_fingerprint_reports_installed_versions_and_is_json() -> None:
    fp = environment_fingerprint(include_devices=False)
    assert fp["packages"]["apache-beam"] == metadata.version("apache-beam")
    assert fp["packages"]["jax"] == metadata.version("jax")
    assert fp["python"] == ".".join(map(str, sys.version_info[:3]))
    assert "devices" not in fp
    json.dumps(fp)


def test_fingerprint_does_not_import_jax() -> None:
    code = (
        "import sys; from tidal.integrity.fingerprint import environment_fingerprint as f; "
        "fp = f(); print('jax' in sys.modules, 'devices' in fp)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_fingerprint_reads_devices_of_imported_jax() -> None:
    import jax

    fp = environment_fingerprint()
    assert fp["devices"]["backend"] == jax.default_backend()
    assert fp["devices"]["local_device_count"] == len(jax.local_devices())


def test_diff_names_each_change() -> None:
    a = {"python": "3.11.7", "packages": {"jax": "0.10.1", "flax": "0.12.8"}}
    b = {"python": "3.11.7", "packages": {"jax": "0.10.2"}}
    assert fingerprint_diff(a, b) == ["packages.flax: 0.12.8 -> <absent>", "packages.jax: 0.10.1 -> 0.10.2"]
    assert fingerprint_diff(a, a) == []
