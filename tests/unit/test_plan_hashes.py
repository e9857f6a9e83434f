"""The registered hash of every plan in the repository, pinned: a change to the plan language
that moves a registered plan's hash (a new field serialized while at its default, a renamed
key, a changed default) fails here, before it orphans the verdicts stored under the old hash.

Each plan is read as `orch plan register FILE` reads it (``load_plan_file``: paths next to the
file resolve from its folder) and hashed by ``plan_hash`` (sha256 of ``canonical_json``), the
sha256 the store keeps. Values computed on the code of issue 28's typed seams; a deliberate
change to the language updates them here, with the reason in its commit."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.plan import canonical_json, load_plan_file, plan_from_canonical, plan_hash

ROOT = Path(__file__).resolve().parents[2]
PLAN_DIRS = ("examples", "tests/e2e/plans")

REGISTERED: dict[str, str] = {
    "examples/demo.yaml": "a763118b4b73c4f7e22dd15171019328aa94f39bd4b08bdba4e110aa5d4be946",
    "examples/disagg-vs-colocated-h200.yaml": "6a5e9431033f2be92bac3b6beafdf80ff6779f7457568b0761ae4113c73a1765",
    "examples/external-ab.yaml": "f7d4d68c9f32d416e441da02172463fd36d5e447c17ac06db0eb75a537b146d9",
    "examples/fp8-kv-h100.yaml": "b3f289b4f71ebddd44aece75bf1a59dfdfcd8171a8034f6df7ba19d08771c4db",
    "examples/k8s-rehearsal.yaml": "683a62423a4c549dfa8bae7b66536a1c0a305c35c5e9a2b3d3c2380d15d1fb03",
    "examples/open-vs-closed.yaml": "3881d0aadbdf702a15bd2a9aca29e58ba823a691167e837d290e3919e6174783",
    "examples/quickstart.yaml": "f83a1591c193d0f33249600bb8b412feefe9019c2aae48ec9b074f97ee0057e9",
    "examples/router-cache-aware.yaml": "0e07b3a95c73575fa4eeb9ca4aa4794f631211852d94f7ce0f4191fb5e289738",
    "examples/sweep.yaml": "7a9434bb36d0e97c7aa7a4f906bf91f08e036b4eaf49a2fe1eb9b3b8bb1caeff",
    "examples/three-arms.yaml": "3bec982e255b972bb38214898a62d2adfe8d2ff1009006742642274a5f1dade4",
    "examples/vllm-vs-sglang.yaml": "45237120e39fde34cfc6e26d033ed79718cc37b80b5e5570f08cb0d3f84545e0",
    "tests/e2e/plans/k8s-quickstart.yaml": "2ab15a2ce80495b4b03d648b74adafd1e673d5eb66c6b55ae943d99074f87ff1",
    "tests/e2e/plans/two-vs-one.yaml": "e9bcb57bc33a15e73527b865087c1ef4c240dc9e969eb110c08531861c33858d",
    "tests/e2e/plans/two-vs-one-sequential.yaml": "e68a70bce466544de378f799c12a1567213b60179866ab43ef959f8d90e5260a",
    "tests/e2e/plans/two-vs-one-lead-in.yaml": "25d6b0040edaec0d5cac33f4f721ffe142cb28c14e7a8fbbcbdf9bccf5821cae",
}


def test_every_plan_file_has_its_hash_pinned() -> None:
    found = {str(p.relative_to(ROOT)) for d in PLAN_DIRS for p in (ROOT / d).glob("*.yaml")}
    assert found == set(REGISTERED), "a plan added or removed: pin its hash in REGISTERED"


@pytest.mark.parametrize("rel", sorted(REGISTERED))
def test_a_registered_plan_keeps_its_hash(rel: str) -> None:
    plan = load_plan_file(ROOT / rel)
    assert plan_hash(plan) == REGISTERED[rel]
    # What the store keeps reads back to the same plan, and so the same hash.
    assert plan_hash(plan_from_canonical(canonical_json(plan))) == REGISTERED[rel]
