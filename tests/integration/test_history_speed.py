"""The fast history paths (issue 20 speed) answer what the straightforward pandas computation
over capacity_by_config answers: best_config's SQL sort and LIMIT, filters that skip the joins
to configurations and workloads, the live aggregate on the covering index (0009), and the
order and columns of every frame. Correctness only: speed is measured by
benchmarks/store_bench.py, never asserted here."""

from __future__ import annotations

import pandas as pd
import pytest

from orchestrator.store import Store
from orchestrator.store.history import BY_CONFIG_COLUMNS
from tests.integration.test_store_history import _seed


@pytest.fixture
def seeded(db_url: str):
    store = Store.open(db_url)
    configs = _seed(store)
    yield store, configs
    store.close()


def _reference_best(frame: pd.DataFrame, top: int, per_gpu: bool, min_runs: int) -> pd.DataFrame:
    """best_config as it was computed before: filter, sort and cut in pandas."""
    frame = frame[frame["runs"] >= min_runs]
    frame = frame.assign(per_gpu=frame["median"] / frame["gpus"])
    key = "per_gpu" if per_gpu else "median"
    return frame.sort_values([key, "config_id"], ascending=[False, True]).head(top).reset_index(drop=True)


@pytest.mark.parametrize("since_days", [None, 10_000])
@pytest.mark.parametrize(("top", "per_gpu", "min_runs"), [(1, False, 1), (3, True, 1), (5, False, 4), (2, True, 99)])
def test_best_config_sorted_and_limited_in_sql_equals_pandas(seeded, since_days, top, per_gpu, min_runs) -> None:
    store, _ = seeded
    for cls in ("interactive", "standard", "nope"):
        whole = store.capacity_by_config(service_class=cls, since_days=since_days)
        got = store.best_config(cls, top=top, per_gpu=per_gpu, min_runs=min_runs, since_days=since_days)
        want = _reference_best(whole, top, per_gpu, min_runs)
        assert list(got.columns) == [*BY_CONFIG_COLUMNS, "per_gpu"]
        assert got.to_dict("records") == want.to_dict("records")


@pytest.mark.parametrize("since_days", [None, 10_000])
def test_filters_equal_filtering_the_whole_history(seeded, since_days) -> None:
    """A filter on the class only (no join), on the configuration (joined) and on the
    workload's values (joined) keep exactly the matching rows of the unfiltered frame, in order."""
    store, configs = seeded
    whole = store.capacity_by_config(since_days=since_days)
    assert list(whole.columns) == list(BY_CONFIG_COLUMNS)
    assert len(whole) == 8
    cases = [
        ({"service_class": "standard"}, whole["class"] == "standard"),
        ({"gpu": "H200"}, whole["gpu"] == "H200"),
        ({"config_id": configs["disagg"]}, whole["config_id"] == configs["disagg"]),
        ({"input_tokens": (0, 1e9)}, whole["input_mean"].notna()),
        ({"input_tokens": (1e9, None)}, whole["config_id"] < 0),
        ({"simulated": False}, ~whole["simulated"]),
    ]
    for filters, mask in cases:
        got = store.capacity_by_config(since_days=since_days, **filters)
        want = whole[mask].reset_index(drop=True)
        assert got.to_dict("records") == want.to_dict("records"), filters


def test_order_is_class_then_median_descending_then_configuration(seeded) -> None:
    store, _ = seeded
    for frame in (store.capacity_by_config(), store.capacity_by_config(since_days=10_000),
                  store.capacity_by_config(observed_engine="no-such-engine")):
        resorted = frame.sort_values(["class", "median", "config_id"], ascending=[True, False, True], kind="stable")
        assert frame.to_dict("records") == resorted.reset_index(drop=True).to_dict("records")
        if not frame.empty:
            assert str(frame["last_measured"].dt.tz) == "UTC"
            assert frame["simulated"].dtype == bool
