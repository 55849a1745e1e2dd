"""Real Helm on helm/tidal: a copy of the chart with the Airflow stand-in, rendered per values file.

``helm`` is built from helm.sh/helm/v4 by ``tools/k8s/install.sh`` (``make tools``). The chart's
Airflow dependency (the official chart, whose repository cannot be reached here) is replaced in
the copy by ``tests/deploy/airflow_standin``, which renders only the service accounts the real
chart creates from the same values; helm/tidal/Chart.yaml keeps the real dependency.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.cluster.kube import tool_paths

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "tidal"
STANDIN = Path(__file__).with_name("airflow_standin")
VALUES_FILES = ("values.yaml", "values-dev.yaml", "values-prod.yaml")
RELEASE = {"Name": "tidal", "Namespace": "airflow", "Service": "Helm"}
SOURCE = re.compile(r"^# Source: (\S+)$", re.MULTILINE)


def deep_merge(base: dict, override: dict) -> dict:
    """Helm's coalescing of a values file over the chart defaults: maps merge, the rest replace."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def chart_values(name: str) -> dict:
    """The values ``-f name`` gives the templates (values.yaml alone for itself)."""
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    return defaults if name == "values.yaml" else deep_merge(defaults, yaml.safe_load((CHART / name).read_text()))


def helm_binary() -> Path:
    """The Helm ``make tools`` built; skipped without it, a failure under ``CI=true``."""
    helm = tool_paths()["HELM"]
    if not helm.exists():
        reason = f"helm not built at {helm} (run `make tools`)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return helm


def chart_copy(directory: Path) -> Path:
    """helm/tidal copied to ``directory`` with the Airflow stand-in as its charts/airflow."""
    chart = directory / "tidal"
    shutil.copytree(CHART, chart)
    shutil.copytree(STANDIN, chart / "charts" / "airflow")
    return chart


def helm(*args: str, chart: Path, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([str(helm_binary()), *args], check=False, capture_output=True, text=True, timeout=120,
                            cwd=chart.parent, env={**os.environ, "HELM_CACHE_HOME": str(chart.parent / ".helm"),
                                                   "HELM_CONFIG_HOME": str(chart.parent / ".helm"),
                                                   "HELM_DATA_HOME": str(chart.parent / ".helm")})
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result


def values_args(chart: Path, values_file: str) -> list[str]:
    return [] if values_file == "values.yaml" else ["-f", str(chart / values_file)]


def rendered(chart: Path, values_file: str) -> str:
    """``helm template tidal CHART -n airflow [-f values_file]``: the release's manifests as YAML."""
    return helm("template", RELEASE["Name"], str(chart), "-n", RELEASE["Namespace"],
                *values_args(chart, values_file), chart=chart).stdout


def documents(text: str) -> list[tuple[str, dict]]:
    """Each rendered object with the template it came from (Helm's ``# Source:`` line)."""
    out = []
    for part in re.split(r"^---\s*$", text, flags=re.MULTILINE):
        source = SOURCE.search(part)
        obj = yaml.safe_load(part)
        if obj:
            out.append((source[1] if source else "", obj))
    return out
