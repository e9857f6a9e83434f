"""A store of capacities only, for the verdict and effects arithmetic in unit tests (the real
store runs in the e2e tests): one valid, finished run per (block, arm) with its capacity at the
class ``standard``."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd


class CapacityStore:
    """Capacities per (block, arm), one valid run each."""

    def __init__(self, caps: dict[tuple[int, str], float]) -> None:
        self._runs = [SimpleNamespace(id=i, block=b, arm=arm, status="done", valid=True, finished=True)
                      for i, (b, arm) in enumerate(sorted(caps))]
        ids = {(r.block, r.arm): r.id for r in self._runs}
        self._caps = pd.DataFrame([{"run_id": ids[k], "class_name": "standard", "capacity": v}
                                   for k, v in caps.items()])

    def runs(self, experiment_id: int) -> list[SimpleNamespace]:
        return self._runs

    def guard_results(self, run_id: int) -> list[object]:
        return []

    def capacities(self, experiment_id: int) -> pd.DataFrame:
        return self._caps

    def points(self, run_id: int) -> pd.DataFrame:
        return pd.DataFrame()
