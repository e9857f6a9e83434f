"""Files a plan names are regular files, read with a bound (issue 30): a plan that is a symlink
to a FIFO, a source or tokenizer under /proc, /sys or /dev, or a source that is not data are
refused at `plan validate` in one line each, before anything is deployed, and nothing hangs."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.errors import PlanError
from orchestrator.plan import load_plan_file
from orchestrator.plan.sources import DataFileError, file_sha256, read_bounded
from tests.unit.test_workload_data import DATA, PLAN

pytestmark = pytest.mark.unit


def _load_within(path: Path, seconds: float = 20.0) -> BaseException | None:
    """load_plan_file(path) in a thread: what it raised (None: it loaded); fails the test if it
    is still reading after ``seconds`` (a hang, not a slow machine: nothing here computes)."""
    out: list[BaseException | None] = []

    def load() -> None:
        try:
            load_plan_file(path)
            out.append(None)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out.append(e)

    t = threading.Thread(target=load, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        pytest.fail(f"load_plan_file({path}) still blocked after {seconds} s")
    return out[0]


def _write(tmp_path: Path, workload: dict[str, Any]) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump({**PLAN, "workload": workload}))
    return path


def _problems(e: BaseException | None) -> list[tuple[str, str]]:
    assert isinstance(e, PlanError), e
    return [(p.path, p.message) for p in e.plan_problems]


def test_a_plan_that_is_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "plan.fifo"
    os.mkfifo(fifo)
    link = tmp_path / "plan.yaml"
    link.symlink_to(fifo)
    e = _load_within(link)
    assert isinstance(e, PlanError) and len(e.problems) == 1 and "a FIFO, not a regular file" in e.problems[0]


@pytest.mark.parametrize("path", ["/proc/self/pagemap", "/proc/self/environ", "/sys/kernel/mm/transparent_hugepage/enabled",
                                  "/dev/zero"])
def test_a_source_under_the_kernel_or_device_trees_is_refused(tmp_path: Path, path: str) -> None:
    e = _load_within(_write(tmp_path, {"source": {"kind": "prompts", "path": path}}))
    ((where, message),) = _problems(e)
    assert where == "workload.source.path" and "kernel or device file" in message


def test_a_tokenizer_under_proc_is_refused(tmp_path: Path) -> None:
    e = _load_within(_write(tmp_path, {
        "prompts": {"input_tokens": {"mean": 100}}, "output_tokens": 16,
        "tokenizer": {"file": "/proc/self/environ"}}))
    ((where, message),) = _problems(e)
    assert where == "workload.tokenizer.file" and "kernel or device file" in message


def test_a_fifo_source_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "prompts.jsonl"
    os.mkfifo(fifo)
    e = _load_within(_write(tmp_path, {"source": {"kind": "prompts", "path": str(fifo)}}))
    ((where, message),) = _problems(e)
    assert where == "workload.source.path" and "a FIFO" in message


def test_a_source_that_is_not_data_fails_at_validation(tmp_path: Path) -> None:
    """/etc/passwd is a regular file: refused by its shape when the plan is loaded, even with
    the plan's own lengths given (nothing then needed the file's stats)."""
    e = _load_within(_write(tmp_path, {"source": {"kind": "prompts", "path": "/etc/passwd"},
                                       "prompts": {"input_tokens": {"mean": 100}}, "output_tokens": 16}))
    ((where, message),) = _problems(e)
    assert where == "workload.source.path" and "not JSON" in message


def test_a_real_prompts_file_still_loads(tmp_path: Path) -> None:
    assert _load_within(_write(tmp_path, {"source": {"kind": "prompts", "path": str(DATA / "prompts.jsonl")}})) is None


def test_the_read_bound_is_counted_not_taken_from_the_stated_size(tmp_path: Path) -> None:
    f = tmp_path / "data.jsonl"
    f.write_bytes(b"x" * 1000)
    assert len(read_bounded(f, limit=1000)) == 1000
    with pytest.raises(DataFileError, match="larger than 999 bytes"):
        read_bounded(f, limit=999)
    with pytest.raises(DataFileError, match="a directory"):
        file_sha256(tmp_path)


def test_a_tokenizer_file_that_is_not_a_tokenizer_fails_at_validation(tmp_path: Path) -> None:
    """Issue 32: `tokenizer.file` naming something the tokenizers library cannot load is found
    at `plan validate`, not after an arm is deployed."""
    bogus = tmp_path / "tokenizer.json"
    bogus.write_text('{"not": "a tokenizer"}')
    e = _load_within(_write(tmp_path, {"prompts": {"input_tokens": {"mean": 100}}, "output_tokens": 16,
                                       "tokenizer": {"file": str(bogus)}}))
    ((where, message),) = _problems(e)
    assert where == "workload.tokenizer.file" and "not a tokenizer.json" in message
