"""One simulated engine worker: vLLM-style continuous batching, step by step (pure).

The worker knows no clock of its own. A driver calls ``begin_step(now)``, which schedules the
next step and returns its duration, then ``end_step(end)`` once that time has passed (virtual
time: at once; the real-time server: after sleeping). Both drivers share this code, so the
server streams tokens at exactly the times the virtual engine predicts.

Scheduling follows vLLM v1: running sequences first (a decode token each, k + 1 positions with
speculative decoding), then partial prefills, then waiting requests in arrival order while the
step's token budget (max_num_batched_tokens), max_num_seqs and KV memory allow; a prompt longer
than the budget is spread over several steps (chunked prefill). When output growth does not fit
the KV cache, the most recently admitted sequence is preempted (its KV freed, recomputed later).

Decoding is tracked in aggregate (a heap of finish steps, a running sum of context) so a step
costs O(finished + admitted), not O(batch): the virtual engine needs ~100x real time.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left
from collections import deque
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Any

from orchestrator.sim.engine.cache import KVMemory
from orchestrator.sim.engine.chains import ChainMemory
from orchestrator.sim.model import BLOCK_TOKENS, WorkerModel

WAITING, TRANSFER, PREFILL, DECODE, DONE = range(5)


@dataclass(slots=True, eq=False)
class Sequence:
    """A request inside a worker."""

    key: int
    prompt_tokens: int
    max_tokens: int  # tokens this worker produces before the sequence ends
    # chained hashes of the prompt's full blocks (chains.Blocks with ``chain_blocks``)
    hashes: Seq[int] = ()
    remote_tokens: int = 0  # P/D decode side: prompt KV that arrives by transfer (no prefill)
    tag: Any = None  # the driver's own handle (Any: mypyc's dataclasses resolve annotations by name)
    # progress
    state: int = WAITING
    computed: int = 0  # prompt (+ recomputed output) tokens whose KV exists
    target: int = 0  # tokens to compute before sampling (prompt, or prompt + output after preemption)
    generated: int = 0
    cached_tokens: int | None = None  # prefix-cache hit of the first admission
    hit_blocks: int = 0
    shared_blocks: int = 0  # blocks referenced in the cache (hits, then published blocks)
    private: float = 0.0  # tokens owned alone
    ready_at: float = 0.0  # TRANSFER: when the KV has arrived
    dec_start: int = 0  # first decode step index
    dec_gen0: int = 0  # generated at dec_start
    finish_step: int = -1
    admit_no: int = 0
    first_token_s: float | None = None
    last_token_s: float | None = None
    max_gap_s: float = 0.0
    chunks: int = 0
    preemptions: int = 0
    emitted: list[int] = field(default_factory=list)  # tokens per emission (server streaming)


@dataclass(slots=True)
class StepResult:
    """What one step produced."""

    end_s: float
    duration_s: float
    first_tokens: list[Sequence]  # sequences whose first token this step sampled
    finished: list[Sequence]
    decoded: list[tuple[Sequence, int]]  # (sequence, tokens) when emissions are wanted


class Worker:
    """Continuous batching on one worker, driven step by step."""

    def __init__(
        self,
        model: WorkerModel,
        *,
        link_bytes_s: float = 0.0,
        stall_every_steps: int = 0,
        stall_s: float = 0.0,
        track_emissions: bool = False,
        name: str = "worker",
        chain_blocks: bool = False,
    ):
        self.model = model
        self.name = name
        # chain_blocks: sequences carry chains.Blocks (the virtual engine's PromptHasher), kept
        # per chain; else any hashes, kept per block (the real-time server)
        self.memory: KVMemory | ChainMemory = (ChainMemory if chain_blocks else KVMemory)(
            model.kv_capacity_tokens, caching=model.prefix_caching)
        self.link_bytes_s = link_bytes_s or model.gpu.nvlink_bytes_s
        self.link_free_at = 0.0
        self.stall_every = stall_every_steps
        self.stall_s = stall_s
        self.track = track_emissions
        self.e = model.tokens_per_pass
        self._ceil_e = math.ceil(self.e)  # KV growth a decoding sequence may need in one step
        self.k = model.speculative_k
        self.waiting: deque[Sequence] = deque()
        self.transferring: list[Sequence] = []
        self.prefilling: list[Sequence] = []
        self.decoding: dict[int, Sequence] = {}
        self.finish_heap: list[tuple[int, int, Sequence]] = []
        self.dec_context = 0.0  # sum of context tokens of decoding sequences
        self.step_no = 0
        self.durations: list[float] = []  # by step index
        self.ends: list[float] = []
        # Steps whose duration exceeds every later one's (a monotonic stack): the longest step
        # since any step is one bisection away (a finishing sequence's largest token gap).
        self._peak_steps: list[int] = []
        self._peak_durs: list[float] = []
        self._plan: list[tuple[Sequence, int]] = []
        self._plan_dec = 0
        self._pending_s = 0.0
        self._admits = 0
        self._host_debt_s = 0.0  # front-end work done on the engine's cores during the current step
        # vLLM counters
        self.preemptions = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.requests_done = 0

    # --- queue ----------------------------------------------------------------------------
    def submit(self, seq: Sequence) -> None:
        """A request arrives at this worker."""
        self.waiting.append(seq)

    def charge_host(self, seconds: float) -> None:
        """Front-end work on the engine's own cores while a step runs: the next step starts
        that much later (time-sharing one core; an idle engine loses nothing)."""
        self._host_debt_s += seconds

    @property
    def running(self) -> int:
        """Sequences in the batch (vllm:num_requests_running)."""
        return len(self.prefilling) + len(self.decoding)

    @property
    def load(self) -> int:
        """Requests inside the worker (running, waiting, transferring)."""
        return self.running + len(self.waiting) + len(self.transferring)

    def has_step_work(self) -> bool:
        """True when a step would do something now."""
        return bool(self.decoding or self.prefilling or self.waiting)

    def next_wakeup(self) -> float | None:
        """Earliest KV arrival when only transfers are pending."""
        return min((s.ready_at for s in self.transferring), default=None)

    def tokens_at(self, seq: Sequence, step: int) -> int:
        """Tokens a decoding sequence holds after step ``step`` completed."""
        n = step - seq.dec_start + 1
        if n <= 0:
            return seq.dec_gen0
        got = seq.dec_gen0 + (n if self.e == 1.0 else int(math.floor(n * self.e + 1e-9)))
        return min(got, seq.max_tokens)

    # --- stepping -------------------------------------------------------------------------
    def begin_step(self, now: float) -> float | None:
        """Schedule the next step at ``now``; its duration, or None when there is nothing to do."""
        if self.transferring:
            self._land_transfers(now)
        decoding, prefilling, mem = self.decoding, self.prefilling, self.memory
        if (decoding or prefilling) and mem.free_tokens() < len(decoding) * self._ceil_e:
            self._make_room()
        n_dec = len(decoding)
        budget = self.model.max_num_batched_tokens - n_dec * (self.k + 1)
        plan: list[tuple[Sequence, int]] = []
        for seq in prefilling:
            if budget <= 0:
                break
            n = min(seq.target - seq.computed, budget)
            plan.append((seq, n))
            budget -= n
        waiting = self.waiting
        if waiting:
            max_seqs = self.model.max_num_seqs
            while waiting and len(prefilling) + n_dec + len(self.transferring) < max_seqs:
                seq = waiting[0]
                if seq.remote_tokens:
                    if not self._admit(seq, now):
                        break
                    continue
                if budget <= 0 or not self._admit(seq, now):
                    break
                n = min(seq.target - seq.computed, budget)
                plan.append((seq, n))
                budget -= n
        if not plan and not n_dec:
            return None
        dur = self.model.step_time_pairs(n_dec, self.dec_context, [(n, s.computed) for s, n in plan])
        if self.stall_every and (self.step_no + 1) % self.stall_every == 0:
            dur += self.stall_s
        if self._host_debt_s:
            dur += self._host_debt_s
            self._host_debt_s = 0.0
        self._plan = plan
        self._plan_dec = n_dec
        self._pending_s = dur
        mem.grow(n_dec * self.e)  # output KV written by this step
        return dur

    def end_step(self, end: float) -> StepResult:
        """Apply the step scheduled by ``begin_step``, which ended at ``end``."""
        step = self.step_no
        dur = self._pending_s
        self.durations.append(dur)
        self.ends.append(end)
        steps, durs = self._peak_steps, self._peak_durs
        while durs and durs[-1] <= dur:
            durs.pop()
            steps.pop()
        steps.append(step)
        durs.append(dur)
        firsts: list[Sequence] = []
        finished: list[Sequence] = []
        decoded: list[tuple[Sequence, int]] = []
        # decode tokens of this step
        if self._plan_dec:
            gain = self._plan_dec * self.e
            self.dec_context += gain
            self.generation_tokens_total += int(round(gain))
            if self.track:
                for seq in self.decoding.values():
                    got = self.tokens_at(seq, step) - self.tokens_at(seq, step - 1)
                    if got:
                        decoded.append((seq, got))
            heap = self.finish_heap
            while heap and heap[0][0] <= step:
                _, _, seq = heapq.heappop(heap)
                if seq.state != DECODE or seq.finish_step != step:
                    continue  # preempted since; stale entry
                self._finish(seq, end)
                finished.append(seq)
        # prefill chunks of this step
        if self._plan:
            self._end_prefills(step, end, firsts, finished, decoded)
            self._plan = []
        self._plan_dec = 0
        self.step_no += 1
        return StepResult(end, dur, firsts, finished, decoded)

    def quiet_steps(self, t: float, before: float, until: float) -> tuple[float, int]:
        """Virtual time's shortcut for plain decode steps: with the pending step ending at
        ``t``, end it and begin the next (``end_step`` then ``begin_step``, the same arithmetic),
        again while both are plain (only decodes, none finishing, nothing waiting, no
        preemption, stall or emissions) and each next step ends before ``before`` and by
        ``until``. Returns when the pending step ends and how many steps were ended here."""
        if self._plan or self.waiting or self.prefilling or self.transferring or self.track or self.stall_every:
            return t, 0  # the usual way out (a prefill step): first, cheapest
        n_dec = len(self.decoding)
        if not n_dec or n_dec != self._plan_dec:
            return t, 0
        heap, mem = self.finish_heap, self.memory
        need = n_dec * self._ceil_e
        gain = n_dec * self.e
        gen = int(round(gain))
        step_time = self.model.step_time_pairs
        no_chunks: list[tuple[int, int]] = []
        durations, ends, steps, durs = self.durations, self.ends, self._peak_steps, self._peak_durs
        step = self.step_no
        n = 0
        while heap and heap[0][0] > step and mem.free_tokens() >= need:
            # end the pending step: a plain decode step
            dur = self._pending_s
            durations.append(dur)
            ends.append(t)
            while durs and durs[-1] <= dur:
                durs.pop()
                steps.pop()
            steps.append(step)
            durs.append(dur)
            self.dec_context += gain
            self.generation_tokens_total += gen
            step += 1
            self.step_no = step
            n += 1
            # begin the next
            dur = step_time(n_dec, self.dec_context, no_chunks)
            if self._host_debt_s:
                dur += self._host_debt_s
                self._host_debt_s = 0.0
            self._pending_s = dur
            mem.grow(gain)
            t += dur
            if not (t < before and t <= until):
                break
        return t, n

    def _end_prefills(self, step: int, end: float, firsts: list[Sequence], finished: list[Sequence],
                      decoded: list[tuple[Sequence, int]]) -> None:
        mem = self.memory
        for seq, n in self._plan:
            seq.computed += n
            if seq.computed < seq.target:
                continue
            self.prefilling.remove(seq)
            published = mem.publish(seq.hashes, seq.shared_blocks)
            seq.shared_blocks = len(seq.hashes) if mem.caching else 0
            seq.private -= published
            seq.generated += 1  # the step that completes a prompt samples a token
            self.generation_tokens_total += 1
            mem.grow(1)
            seq.private += 1
            self._emit(seq, end, 1)
            if seq.chunks == 1:
                firsts.append(seq)
            if self.track:
                decoded.append((seq, 1))
            if seq.generated >= seq.max_tokens:
                seq.state = DONE
                mem.release(seq.hashes[: seq.shared_blocks], seq.private)
                self.requests_done += 1
                finished.append(seq)
            else:
                self._start_decode(seq, step + 1)

    # --- internals ------------------------------------------------------------------------
    def _emit(self, seq: Sequence, t: float, tokens: int) -> None:
        if seq.last_token_s is not None:
            gap = t - seq.last_token_s
            if gap > seq.max_gap_s:
                seq.max_gap_s = gap
        else:
            seq.first_token_s = t
        seq.last_token_s = t
        seq.chunks += 1

    def _admit(self, seq: Sequence, now: float) -> bool:
        mem = self.memory
        hit = mem.cached_blocks(seq.hashes, seq.prompt_tokens)
        cached = hit * BLOCK_TOKENS
        if seq.remote_tokens and seq.generated == 0:
            # P/D decode side: the prompt's KV arrives by transfer; the local cache still helps.
            need = seq.prompt_tokens - cached
        else:
            need = seq.prompt_tokens + seq.generated - cached
        # Like vLLM v1, no watermark: a prompt is admitted when it fits now, and output growth
        # that no longer fits preempts the newest sequence (the thrash that makes an open loop
        # past capacity yield less than a closed loop). With nothing running, nothing will free
        # memory: admit anyway rather than deadlock.
        if need + BLOCK_TOKENS > mem.free_tokens() and (self.running or self.transferring):
            return False
        self.waiting.popleft()
        if seq.cached_tokens is None:
            seq.cached_tokens = cached
            mem.queries += seq.prompt_tokens
            mem.hits += cached
            self.prompt_tokens_total += seq.prompt_tokens
        mem.admit(seq.hashes, hit, need)
        seq.hit_blocks = hit
        seq.shared_blocks = hit
        seq.private = float(need)  # a float attribute (mypyc keeps it unboxed)
        seq.computed = cached
        seq.target = seq.prompt_tokens + seq.generated
        self._admits += 1
        seq.admit_no = self._admits
        if seq.remote_tokens and seq.generated == 0:
            tokens = max(0, min(seq.remote_tokens, seq.prompt_tokens) - cached)
            start = max(now, self.link_free_at)
            seq.ready_at = start + self.model.kv_transfer_s(tokens, self.link_bytes_s)
            self.link_free_at = seq.ready_at
            seq.state = TRANSFER
            self.transferring.append(seq)
        else:
            seq.state = PREFILL
            self.prefilling.append(seq)
        return True

    def _land_transfers(self, now: float) -> None:
        still: list[Sequence] = []
        for seq in self.transferring:
            if seq.ready_at <= now:
                # All but the last token's KV arrived; the decode worker computes that one and
                # samples the first token (vLLM NixlConnector behaviour).
                seq.computed = seq.target - 1
                seq.state = PREFILL
                self.prefilling.append(seq)
            else:
                still.append(seq)
        self.transferring = still

    def _start_decode(self, seq: Sequence, step: int) -> None:
        seq.state = DECODE
        seq.dec_start = step
        seq.dec_gen0 = seq.generated
        left = seq.max_tokens - seq.generated
        seq.finish_step = step + max(1, math.ceil(left / self.e - 1e-9)) - 1
        self.decoding[seq.key] = seq
        self.dec_context += seq.prompt_tokens + seq.generated
        heapq.heappush(self.finish_heap, (seq.finish_step, seq.key, seq))

    def _leave_decode(self, seq: Sequence, step_done: int) -> None:
        del self.decoding[seq.key]
        seq.generated = self.tokens_at(seq, step_done)
        self.dec_context -= seq.prompt_tokens + seq.generated
        if self.dec_context < 0 or not self.decoding:  # float drift with speculative E
            self.dec_context = max(self.dec_context, 0.0) if self.decoding else 0.0
        seq.private = max(0.0, (seq.prompt_tokens + seq.generated) - seq.shared_blocks * BLOCK_TOKENS)

    def _finish(self, seq: Sequence, end: float) -> None:
        step = self.step_no
        self._leave_decode(seq, step)
        # The worker never idles while a sequence decodes, so the gaps between its tokens are
        # the durations of its decode steps (each emits at its end).
        n_steps = step - seq.dec_start + 1
        if n_steps > 0:
            seq.max_gap_s = max(seq.max_gap_s, self._longest_since(seq.dec_start))
            seq.chunks += n_steps
        seq.last_token_s = end
        seq.state = DONE
        self.memory.release(seq.hashes[: seq.shared_blocks], seq.private)
        self.requests_done += 1

    def _longest_since(self, step: int) -> float:
        """max(self.durations[step:]), the last step included."""
        return self._peak_durs[bisect_left(self._peak_steps, step)]

    def _make_room(self) -> None:
        """Preempt the newest running sequences while this step's output growth does not fit.

        As vLLM's recompute preemption: the victim (last admitted, decoding or still
        prefilling) loses its KV and goes back to the head of the queue; tokens it already
        streamed stay streamed, and its prompt plus output is recomputed on readmission.
        """
        growth = len(self.decoding) * math.ceil(self.e)
        while (self.decoding or self.prefilling) and self.memory.free_tokens() < growth:
            victim = max(
                (*self.decoding.values(), *self.prefilling), key=lambda s: s.admit_no
            )
            if victim.state == DECODE:
                done_step = self.step_no - 1
                n_steps = done_step - victim.dec_start + 1
                if n_steps > 0:
                    victim.max_gap_s = max(victim.max_gap_s, self._longest_since(victim.dec_start))
                    victim.chunks += n_steps
                    victim.last_token_s = self.ends[done_step]
                self._leave_decode(victim, done_step)
            else:
                self.prefilling.remove(victim)
            self.memory.release(victim.hashes[: victim.shared_blocks], victim.private)
            victim.state = WAITING
            victim.preemptions += 1
            victim.remote_tokens = 0
            self.preemptions += 1
            self.waiting.appendleft(victim)
            growth = len(self.decoding) * math.ceil(self.e)
