"""Every YAML file in the repository is checked by its kind; a file of no known kind fails."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import yaml

from orchestrator.plan import load_plan_file

ROOT = Path(__file__).resolve().parents[2]


def _tracked_yaml() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.yaml", "*.yml"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()
    return [ROOT / p for p in out]


def _plan(p: Path) -> None:
    load_plan_file(p)


def _plain_yaml(p: Path) -> None:
    yaml.safe_load_all(p.read_text())


def _wrong_plan(p: Path) -> None:
    # Test fixtures that are wrong on purpose must at least be YAML.
    assert yaml.safe_load(p.read_text()) is not None


def _k8s_objects(p: Path) -> None:
    # Manifest bases and expected rendered manifests: strict Kubernetes schemas, 1.29-1.33.
    from tests.unit.test_k8s_render import assert_valid_k8s

    docs = [d for d in yaml.safe_load_all(p.read_text()) if d is not None]
    assert docs, f"{p}: no Kubernetes object"
    for doc in docs:
        assert_valid_k8s(doc, str(p))


def _helm_chart(p: Path) -> None:
    # Chart.yaml, values.yaml and templates: the chart lints strictly, renders, objects validate.
    from tests.unit.test_k8s_chart import check_chart

    check_chart()


# (path prefix, validator). First match wins. Extend as kinds of YAML are added.
KINDS: list[tuple[str, Callable[[Path], None]]] = [
    ("examples/", _plan),
    ("tests/e2e/plans/", _plan),
    ("tests/fixtures/plans/", _wrong_plan),
    ("manifests/", _k8s_objects),
    ("tests/fixtures/k8s/", _k8s_objects),
    ("helm/orchestrator/", _helm_chart),
]


def test_every_yaml_file_has_a_kind_and_passes_it() -> None:
    files = _tracked_yaml()
    assert files, "no YAML files found"
    unknown = []
    for f in files:
        rel = f.relative_to(ROOT).as_posix()
        for prefix, check in KINDS:
            if rel.startswith(prefix):
                check(f)
                break
        else:
            unknown.append(rel)
    assert not unknown, f"YAML files of no known kind (add a validator in KINDS): {unknown}"
