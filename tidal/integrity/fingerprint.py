"""Environment fingerprint: what software and hardware a step ran on.

Recorded in ``step.json`` (every step) and with every training run; never hashed into a step
id (where and how a step runs must not change what it is, see docs/architecture.md §1). Comparing two
fingerprints with :func:`fingerprint_diff` tells a resumed run or an auditor what changed.

The fingerprint is cheap: package versions come from installed distribution metadata
(``importlib.metadata``), so nothing heavy is imported. Device information is read only when
asked for and only from a JAX that the caller has already imported (initialising a backend
is the trainer's job, not ours).
"""

from __future__ import annotations

import platform
import sys
from importlib import metadata
from typing import Any

#: Distributions whose versions decide what a step computes (bytes, tokens or losses).
KEY_PACKAGES = (
    "tidal",
    "numpy",
    "jax",
    "jaxlib",
    "libtpu",
    "jax-cuda12-plugin",
    "jax-cuda12-pjrt",
    "nvidia-cudnn-cu12",
    "flax",
    "optax",
    "orbax-checkpoint",
    "apache-beam",
    "tokenizers",
    "great-expectations",
    "pyarrow",
    "pandas",
    "mlflow",
    "boto3",
    "py3langid",
    "datasketch",
)


def package_versions(names: tuple[str, ...] = KEY_PACKAGES) -> dict[str, str]:
    """Installed versions of ``names`` (distribution names); missing packages are left out."""
    versions: dict[str, str] = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def device_info() -> dict[str, Any] | None:
    """Backend, device kind and counts of an already-imported JAX, else ``None``.

    Returns ``{"backend", "device_kind", "local_device_count", "device_count",
    "process_count"}``. Does not import JAX itself: a data step must not pay for (or
    initialise) an accelerator runtime just to be fingerprinted.
    """
    jax = sys.modules.get("jax")
    if jax is None:
        return None
    try:
        devices = jax.local_devices()
        return {
            "backend": jax.default_backend(),
            "device_kind": devices[0].device_kind if devices else "none",
            "local_device_count": len(devices),
            "device_count": jax.device_count(),
            "process_count": jax.process_count(),
        }
    except Exception as exc:  # noqa: BLE001 - a fingerprint must never fail the step it describes
        return {"error": f"{type(exc).__name__}: {exc}"}


def environment_fingerprint(include_devices: bool = True) -> dict[str, Any]:
    """The fingerprint of this process: Python, platform, key packages and (optionally) devices.

    Returns a JSON-serialisable dict with keys ``python`` (e.g. ``"3.11.7"``),
    ``implementation``, ``platform`` (``platform.platform()``), ``machine``, ``packages``
    (``{distribution: version}``) and, when ``include_devices`` and JAX is imported,
    ``devices`` (see :func:`device_info`).
    """
    fingerprint: dict[str, Any] = {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "packages": package_versions(),
    }
    if include_devices:
        devices = device_info()
        if devices is not None:
            fingerprint["devices"] = devices
    return fingerprint


def fingerprint_diff(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Human-readable differences between two fingerprints, e.g. ``"packages.jax: 0.10.1 -> 0.10.2"``.

    Nested dicts are compared key by key; a key present on one side only shows as
    ``"<absent>"`` on the other. An empty list means the environments match.
    """
    changes: list[str] = []

    def walk(a: Any, b: Any, prefix: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                walk(a.get(key, "<absent>"), b.get(key, "<absent>"), f"{prefix}{key}.")
        elif a != b:
            changes.append(f"{prefix.rstrip('.')}: {a} -> {b}")

    walk(before, after, "")
    return changes
