"""Exact prompt lengths in a run (issue 19 item 4): when the plan names a tokenizer
(``workload.tokenizer``), a point's synthetic prompts are fitted to exactly their asked lengths
under it before they are sent, so each record's ``prompt_tokens`` is the served model's own
count. A local ``tokenizer.json`` is loaded once per path; ``server: true`` asks the endpoint's
``POST /tokenize`` for each count (one client per point, closed after)."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from orchestrator.errors import PermanentError
from orchestrator.loadgen.client import TokenizeCounter
from orchestrator.loadgen.workloads import (
    PromptFitError,
    RequestSpec,
    TokenCounter,
    fit_prompts,
    tokenizer_file_counter,
)
from orchestrator.plan.sources import DataFileError, file_sha256
from orchestrator.plan.workload import Workload


@functools.lru_cache(maxsize=8)
def _file_counter(path: str) -> TokenCounter:
    if not Path(path).is_file():
        raise PermanentError(f"workload.tokenizer.file: no such file {path}")
    try:
        return tokenizer_file_counter(path)
    except Exception as e:  # the tokenizers library raises its own Exception type on a bad file
        raise PermanentError(f"workload.tokenizer.file: cannot load {path}: {e}") from e


def _check_pinned(path: str, sha256: str | None) -> None:
    """The registered plan names the tokenizer by its sha256: a file edited since is refused."""
    if sha256 is None:
        return
    try:
        now = file_sha256(path)
    except DataFileError as e:
        raise PermanentError(f"workload.tokenizer.file: {e}") from None
    if now != sha256:
        raise PermanentError(
            f"workload.tokenizer.file: {path} changed since the plan was registered (sha256 {now[:12]}, "
            f"registered {sha256[:12]}); restore it, or register the plan again (another plan)"
        )


def fit_point_prompts(workload: Workload, requests: Sequence[RequestSpec], url: str, model: str,
                      headers: Mapping[str, str] | Iterable[tuple[str, str]] | None = None) -> list[RequestSpec]:
    """``requests`` fitted under the plan's tokenizer; unchanged (the same list's items) without
    one. A prompt that cannot be fitted is a permanent error (the plan asks for a length its
    shared prefix alone exceeds)."""
    tok = workload.tokenizer
    if tok is None:
        return list(requests)
    try:
        if tok.file is not None:
            _check_pinned(tok.file, tok.sha256)
            return fit_prompts(requests, _file_counter(tok.file))
        hdrs = dict(headers.items()) if isinstance(headers, Mapping) else dict(headers or ())
        with TokenizeCounter(url, model, hdrs) as count:
            return fit_prompts(requests, count)
    except PromptFitError as e:
        raise PermanentError(f"workload.tokenizer: {e}") from e
