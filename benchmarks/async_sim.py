"""Discrete-event simulation of the rollout/training schedules at cluster scale.

A *simulation*, not a measurement: it predicts how long each schedule of the RL loop takes
from a few constants of the engine and the trainer, so that schedules can be compared at
sizes (tens of servers, tens of thousands of responses) that this project's CPU benchmarks
cannot reach, and so that a small real run can print its predicted step next to its
measured one (:func:`calibrate`, :func:`predict`).

Schedules (``train_cfg.max_staleness``; version ``v`` = the weights after ``v`` updates,
step ``s`` trains batch ``s`` on version ``s`` and pushes version ``s + 1``):

* ``sync`` (0): batch ``s`` is generated with version ``s``, then trained, then pushed::

      step = gen(batch) + train + push

  where ``gen(batch)`` ends with the batch's last response.
* ``k1`` (1, a whole batch ahead): with ``G_j``, ``T_s``, ``P_v`` the generation of
  batch ``j``, the update of step ``s`` and the push of version ``v`` (``P_0`` ends at 0)::

      start(G_j)     = max(end(G_{j-1}), end(P_{j-1}))     (j >= 1; G_0 starts at 0)
      start(T_s)     = max(end(G_s), end(P_s))
      start(P_{s+1}) = max(end(T_s), end(G_{s+1}))        (no push under a running batch)

  so batch ``j`` is generated with version ``j - 1`` (batch 0 with version 0) and, in steady
  state, ``step = max(gen, train) + push``.
* ``stream`` (``k >= 2``, no partial rollouts): producers start groups (one prompt's ``K``
  responses) one after another, at most ``inflight_groups`` at a time; group ``g`` belongs
  to batch ``j = g // B`` and may start only while the servers hold a version ``v >= j - k``;
  all of a group is generated with the version held when it starts. Step ``s`` trains once
  all ``B`` groups of batch ``s`` are complete and push ``s`` is done. After an update the
  producers start nothing new, the groups in flight finish (the long tail), then the push
  runs and generation resumes.
* ``stream_partial`` (``k >= 2``, partial rollouts): as ``stream``, but at the push the
  responses in flight are interrupted at once (the tokens of the iterations completed so far
  are kept, the iteration under way is lost), the push runs, and they resume on the new
  weights with a re-prefill of prompt + tokens so far. Nothing is waited for.

Engine model (each of ``N`` servers): continuous batching of at most ``max_running``
sequences; an iteration with ``b`` running sequences takes ``a + c * b`` seconds plus
``p * L`` for every sequence of (prompt + resumed) length ``L`` that joins at that
iteration; every running sequence gets one token per iteration (the joining iteration gives
the first). Sequences wait FIFO at their server and join at the next iteration boundary.
A group goes whole to the server with the fewest sequences (running + waiting). During a
push every server is idle. Trainer (``M`` ranks): ``train = t0 + t_tok * tokens / M`` with
``tokens`` the batch's prompt + response tokens; ``push = push_s``.

Simplified relative to a real engine: iteration cost is linear in the batch (no attention
cost growing with context, no KV-cache limit or preemption: ``max_running`` stands for
it); prefix sharing inside a group is ignored (each response pays its prompt's prefill);
reward computation, data loading and the optimizer's own overlap are not modelled; the
push is a constant, blocking all servers at once; the event loop advances whole iterations
between joins and completions (exact for this model, nothing is fluid).

Usage::

    python benchmarks/async_sim.py                        # cluster case: 64 servers, 512 x 16
    python benchmarks/async_sim.py --preset areal         # AReaL-like setup, vs their figure
    python benchmarks/async_sim.py --servers 1 --prompts 4 --responses 4 --steps 6 \\
        --a 0.02 --c 0.0002 --t0 1 --t-tok 1e-4 --push-s 0.5 --max-staleness 2

Prints one line per schedule::

    schedule=<name> tokens_per_s=<f> step_s=<f> ideal_step_s=<f> speedup=<f> \\
        staleness_mean=<f> staleness_max=<i>

and with ``--preset areal`` an ``areal`` line with their published speed-up.
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import math
import sys
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

SCHEDULES = ('sync', 'k1', 'stream', 'stream_partial')

# AReaL's published figures (see docs/benchmarks.md, "Scheduler simulation", for where).
AREAL_PAPER_SPEEDUP_EARLY = 2.57  # an earlier abstract of arXiv 2505.24298: "up to 2.57x"
AREAL_PAPER_SPEEDUP = 2.77     # arXiv 2505.24298v2/v4 abstract: "up to 2.77x"
AREAL_BLOG_HOURS_1P5B = (41.0, 14.8)  # blog/AReaL_v0_3.md Table 2: 1.5B, 16 nodes, sync vs async


@dataclass
class EngineParams:
    """One inference server: ``iteration(b) = a + c * b`` s, plus ``p * L`` per joining sequence.

    Attributes:
        a: fixed cost of one decode iteration (s).
        c: extra cost per running sequence (s).
        p: prefill cost per token of a joining sequence (s).
        max_running: most sequences decoded at once.
    """

    a: float = 0.025
    c: float = 0.0001
    p: float = 2e-5
    max_running: int = 256


@dataclass
class TrainerParams:
    """The trainer: ``train = t0 + t_tok * tokens / ranks`` s, then ``push_s`` s.

    Attributes:
        t0: fixed cost of an update (s).
        t_tok: seconds per trained token on one rank.
        ranks: trainer ranks ``M``.
        push_s: time to push the new weights to every server (s).
    """

    t0: float = 5.0
    t_tok: float = 4e-4
    ranks: int = 64
    push_s: float = 10.0


@dataclass
class Workload:
    """What is generated and trained.

    Attributes:
        servers: inference servers ``N``.
        prompts: prompts per batch ``B``.
        responses: responses per prompt ``K`` (a group).
        steps: training steps simulated.
        warmup: first steps left out of the averages.
        prompt_len: tokens per prompt.
        lengths: ``'lognormal'`` (median ``median``, ``p99 / p50 = tail``),
            ``'lognormal_group'`` (the same, one draw per group), ``'const'``
            (every response ``median`` tokens) or ``'areal'`` (see :func:`draw_lengths`);
            all capped at ``max_new_tokens``.
        median: median response length (tokens).
        tail: ratio p99 / p50 of the log-normal.
        max_new_tokens: cap on a response's length.
        max_staleness: ``k`` of the streaming schedules (>= 2).
        inflight_groups: most groups in flight when streaming; 0 means
            ``servers * max_running // responses`` (every slot filled).
        seed: seed of the length draws (one draw, shared by every schedule).
    """

    servers: int = 64
    prompts: int = 512
    responses: int = 16
    steps: int = 20
    warmup: int = 2
    prompt_len: int = 256
    lengths: str = 'lognormal'
    median: int = 1024
    tail: float = 6.0
    max_new_tokens: int = 8192
    max_staleness: int = 2
    inflight_groups: int = 0
    seed: int = 0


def n_batches(w: Workload) -> int:
    """Batches drawn and generated: ``steps + max(1, max_staleness)``, so that generation
    ahead of the last trained step runs as it would in a longer run."""
    return w.steps + max(1, w.max_staleness)


def draw_lengths(w: Workload) -> np.ndarray:
    """Response lengths, shape ``(n_batches(w) * prompts, responses)``, one row per group;
    row ``g`` depends only on ``seed`` and ``g`` (more batches extend the same draw).

    * ``lognormal``: ``L = round(median * exp(sigma * z))``, ``z ~ N(0, 1)``,
      ``sigma = ln(tail) / 2.3263`` (so that ``p99 / p50 = tail``).
    * ``areal``: long reasoning traces: a prompt's own median is log-normal around ``median``
      (``sigma = 0.6``) and its responses spread log-normally around it
      (``sigma = ln(tail) / 2.3263``); the cap then truncates the longest (a point mass at
      ``max_new_tokens``). An assumed shape, not fitted to AReaL's data.
    * ``lognormal_group``: as ``lognormal``, one draw per group (its ``K`` responses share
      it), as ``benchmarks/bench_async.py --setup longtail`` imposes them.
    * ``const``: every response ``median`` tokens.

    Lengths are clipped to ``[1, max_new_tokens]``.
    """
    rng = np.random.default_rng(w.seed)
    shape = (n_batches(w) * w.prompts, w.responses)
    sigma = math.log(max(w.tail, 1.0)) / 2.3263
    z = rng.standard_normal((shape[0], shape[1] + 1))   # column 0: the prompt's own draw
    if w.lengths == 'const':
        raw = np.full(shape, float(w.median))
    elif w.lengths == 'lognormal':
        raw = w.median * np.exp(sigma * z[:, 1:])
    elif w.lengths == 'lognormal_group':
        raw = np.repeat(w.median * np.exp(sigma * z[:, :1]), shape[1], axis=1)
    elif w.lengths == 'areal':
        raw = w.median * np.exp(0.6 * z[:, :1] + sigma * z[:, 1:])
    else:
        raise ValueError(f'unknown length distribution {w.lengths!r}')
    return np.clip(np.rint(raw), 1, w.max_new_tokens).astype(np.int64)


class _Server:
    """One server's state between events; iteration ``i`` ends at
    ``t_seg + extra + (i - it) * dt`` while nothing joins or finishes."""

    __slots__ = ('idx', 't_seg', 'extra', 'it', 'dt', 'run', 'queue', 'token')

    def __init__(self, idx: int) -> None:
        self.idx = idx
        self.t_seg = 0.0      # start of the current segment (an iteration boundary)
        self.extra = 0.0      # prefill added to the segment's first iteration
        self.it = 0           # iterations completed by t_seg
        self.dt = 0.0         # one iteration's time with the current batch
        self.run: list[tuple[int, int]] = []   # heap of (finish iteration, seq id)
        self.queue: deque[int] = deque()
        self.token = 0        # invalidates scheduled completions

    @property
    def load(self) -> int:
        return len(self.run) + len(self.queue)


class _Sim:
    """The event loop shared by the schedules (see the module docstring for the rules)."""

    def __init__(self, schedule: str, eng: EngineParams, tr: TrainerParams, w: Workload,
                 lengths: np.ndarray) -> None:
        self.schedule, self.eng, self.tr, self.w = schedule, eng, tr, w
        self.k = {'sync': 0, 'k1': 1}.get(schedule, w.max_staleness)
        self.partial = schedule == 'stream_partial'
        self.length = lengths.reshape(-1).tolist()
        n_seq = len(self.length)
        self.done = [0] * n_seq            # tokens generated before the current run
        self.start_it = [0] * n_seq        # server iteration at which the current run began
        self.run_version = [0] * n_seq     # version of the current run
        self.segments: list[list[tuple[int, int]]] = [[] for _ in range(n_seq)]
        self.servers = [_Server(i) for i in range(w.servers)]
        self.events: list = []
        self.counter = 0
        self.pending: deque[tuple[float, int]] = deque()
        self.paused = False
        self.version = 0
        K, B = w.responses, w.prompts
        self.n_batches = nb = n_batches(w)
        self.group_left = [K] * (nb * B)
        self.batch_left = [B] * nb
        self.batch_start = [math.nan] * nb
        self.batch_end = [math.nan] * nb
        self.train_time = [tr.t0 + tr.t_tok * float(lengths[s * B:(s + 1) * B].sum()
                                                     + w.prompt_len * B * K) / tr.ranks
                           for s in range(nb)]
        self.step_end = [math.nan] * w.steps
        # trainer / producer state
        self.next_train = 0
        self.training = False
        self.pushing = False
        self.push_pending = False     # an update ended, its push has not started
        self.next_batch = 0           # sync / k1: next batch to generate
        self.gen_running = False
        self.next_group = 0           # streaming: next group to start
        self.inflight = 0
        self.cap = w.inflight_groups or max(1, w.servers * eng.max_running // K)

    # ---- events -------------------------------------------------------------------------
    def _at(self, t: float, kind: str, *data) -> None:
        self.counter += 1
        heapq.heappush(self.events, (t, self.counter, kind, data))

    def run_all(self) -> None:
        self._start(0.0)
        while self.pending or self.events:
            if self.pending:
                t, sid = self.pending.popleft()
                self._seq_done(t, sid)
                continue
            t, _, kind, data = heapq.heappop(self.events)
            if kind == 'finish':
                srv = self.servers[data[0]]
                if data[1] == srv.token:
                    self._advance(srv, srv.run[0][0] - srv.it, t)
                    self._admit(srv)
                    self._reschedule(srv)
            elif kind == 'train_end':
                self._train_end(t)
            elif kind == 'push_end':
                self._push_end(t)

    # ---- servers ------------------------------------------------------------------------
    def _advance(self, srv: _Server, k: int, t_boundary: float) -> None:
        """Move ``srv`` ``k`` iterations on, to the boundary at ``t_boundary``; completions go
        to ``pending``."""
        srv.it += k
        srv.t_seg, srv.extra = t_boundary, 0.0
        while srv.run and srv.run[0][0] <= srv.it:
            _, sid = heapq.heappop(srv.run)
            self.segments[sid].append((self.length[sid] - self.done[sid], self.run_version[sid]))
            self.done[sid] = self.length[sid]
            self.pending.append((t_boundary, sid))

    def _admit(self, srv: _Server) -> None:
        if self.paused:
            return
        eng, joined = self.eng, 0
        while srv.queue and len(srv.run) < eng.max_running:
            sid = srv.queue.popleft()
            heapq.heappush(srv.run, (srv.it + self.length[sid] - self.done[sid], sid))
            self.start_it[sid] = srv.it
            self.run_version[sid] = self.version
            joined += self.w.prompt_len + self.done[sid]
        srv.extra += eng.p * joined
        srv.dt = eng.a + eng.c * len(srv.run)

    def _reschedule(self, srv: _Server) -> None:
        srv.token += 1
        if srv.run and not self.paused:
            k = srv.run[0][0] - srv.it
            self._at(srv.t_seg + srv.extra + k * srv.dt, 'finish', srv.idx, srv.token)

    def _sync_to(self, srv: _Server, t: float) -> None:
        """Bring a busy ``srv`` to its first iteration boundary at or after ``t``."""
        if not srv.run or t <= srv.t_seg:
            if not srv.run and t > srv.t_seg:
                srv.t_seg, srv.extra = t, 0.0
            return
        k = max(1, math.ceil((t - srv.t_seg - srv.extra) / srv.dt - 1e-9))
        k = min(k, srv.run[0][0] - srv.it)
        self._advance(srv, k, srv.t_seg + srv.extra + k * srv.dt)

    def _submit_group(self, t: float, g: int) -> None:
        srv = min(self.servers, key=lambda s: s.load)
        K = self.w.responses
        if not self.paused:
            self._sync_to(srv, t)
        srv.queue.extend(range(g * K, (g + 1) * K))
        self._admit(srv)
        self._reschedule(srv)

    def _interrupt_all(self, t: float) -> None:
        """Partial rollouts: stop every server at ``t``, keep the tokens of completed
        iterations, put the runs back at the head of their queues."""
        for srv in self.servers:
            if not srv.run:
                continue
            k = max(0, math.floor((t - srv.t_seg - srv.extra) / srv.dt + 1e-9))
            k = min(k, srv.run[0][0] - srv.it)
            self._advance(srv, k, t)
            back = sorted(srv.run, key=lambda e: e[1])
            for _, sid in back:
                made = srv.it - self.start_it[sid]
                if made:
                    self.segments[sid].append((made, self.run_version[sid]))
                self.done[sid] += made
            srv.run = []
            srv.queue.extendleft(sid for _, sid in reversed(back))
            srv.token += 1
        self.paused = True

    def _resume_all(self, t: float) -> None:
        self.paused = False
        for srv in self.servers:
            srv.t_seg, srv.extra = t, 0.0
            self._admit(srv)
            self._reschedule(srv)

    # ---- schedules ----------------------------------------------------------------------
    def _start(self, t: float) -> None:
        if self.k <= 1:
            self._try_gen(t)
        else:
            self._try_groups(t)

    def _seq_done(self, t: float, sid: int) -> None:
        g = sid // self.w.responses
        self.group_left[g] -= 1
        if self.group_left[g]:
            return
        j = g // self.w.prompts
        self.batch_left[j] -= 1
        if self.k >= 2:
            self.inflight -= 1
        if self.batch_left[j] == 0:
            self.batch_end[j] = t
            self.gen_running = False
        if self.k >= 2:
            if self.push_pending and self.inflight == 0:
                self._push(t)
            self._try_groups(t)
        else:
            if self.batch_left[j] == 0 and self.push_pending:
                self._push(t)
            self._try_gen(t)
        self._try_train(t)

    def _try_gen(self, t: float) -> None:
        """sync / k1: start the next batch when its rule allows."""
        j = self.next_batch
        if j >= self.n_batches or self.gen_running or self.pushing or self.push_pending:
            return
        if self.version < j - self.k:
            return
        self.next_batch += 1
        self.gen_running = True
        self.batch_start[j] = t
        for g in range(j * self.w.prompts, (j + 1) * self.w.prompts):
            self._submit_group(t, g)

    def _try_groups(self, t: float) -> None:
        """Streaming: start groups while the pacing rule and the in-flight cap allow."""
        B, end = self.w.prompts, self.n_batches * self.w.prompts
        if self.pushing or self.push_pending:
            return
        while (self.next_group < end and self.inflight < self.cap
               and self.version >= self.next_group // B - self.k):
            g = self.next_group
            if g % B == 0:
                self.batch_start[g // B] = t
            self.next_group += 1
            self.inflight += 1
            self._submit_group(t, g)

    def _try_train(self, t: float) -> None:
        s = self.next_train
        if (s >= self.w.steps or self.training or self.pushing or self.push_pending
                or self.batch_left[s] or self.version != s):
            return
        self.training = True
        self._at(t + self.train_time[s], 'train_end')

    def _train_end(self, t: float) -> None:
        self.training = False
        self.push_pending = True
        if self.partial:
            self._interrupt_all(t)
            self._push(t)
        elif (self.inflight == 0) if self.k >= 2 else not self.gen_running:
            self._push(t)

    def _push(self, t: float) -> None:
        self.push_pending, self.pushing = False, True
        self.paused = True
        self._at(t + self.tr.push_s, 'push_end')

    def _push_end(self, t: float) -> None:
        self.pushing = False
        self.version += 1
        self.step_end[self.next_train] = t
        self.next_train += 1
        self._resume_all(t)
        self._start(t)
        self._try_train(t)


@dataclass
class ScheduleResult:
    """One schedule's figures (averages over the steps after warm-up).

    Attributes:
        step_s: mean step time (end of push to end of push).
        tokens_per_s: trained (prompt + response) tokens per second.
        ideal_step_s: the schedule's ideal step (see :func:`simulate`).
        staleness_mean: token-weighted mean of ``s - version`` over trained response tokens.
        staleness_max: the largest such staleness.
        step_times: every step's time, warm-up included.
        gen_s: per batch, first start to last completion of its generation.
    """

    step_s: float
    tokens_per_s: float
    ideal_step_s: float
    staleness_mean: float
    staleness_max: int
    step_times: list[float] = field(default_factory=list)
    gen_s: list[float] = field(default_factory=list)
    speedup: float = 1.0


def _gen_bound(eng: EngineParams, w: Workload, lengths: np.ndarray, s: int) -> float:
    """Lower bound on generating batch ``s``: every server at a full batch, no idle time,
    ``(sum(L) * (a + c * R) / R + p * prompt_len * B * K) / N`` with ``R = max_running``."""
    R = eng.max_running
    rows = lengths[s * w.prompts:(s + 1) * w.prompts]
    return (float(rows.sum()) * (eng.a + eng.c * R) / R
            + eng.p * w.prompt_len * rows.size) / w.servers


def simulate(eng: EngineParams, tr: TrainerParams, w: Workload,
             schedules: tuple[str, ...] = SCHEDULES) -> dict[str, ScheduleResult]:
    """Run each schedule on the same length draw.

    Ideal step (mean over steps ``s >= warmup``): ``sync``: ``gen_s + train_s + push``
    (``gen_s`` the batch alone on idle servers, as simulated); ``k1``:
    ``max(gen_{s+1}, train_s) + push`` (batch ``s + 1`` is generated during update ``s``);
    ``stream`` and ``stream_partial``: ``max(gen_bound_s, train_s) + push`` (:func:`_gen_bound`). Speed-up is
    ``tokens_per_s / tokens_per_s(sync)`` when ``sync`` is among ``schedules``.

    Raises:
        ValueError: on an unknown schedule or ``max_staleness < 2`` for streaming.
    """
    if w.steps <= w.warmup:
        raise ValueError('steps must exceed warmup')
    if any(s.startswith('stream') for s in schedules) and w.max_staleness < 2:
        raise ValueError('the streaming schedules need max_staleness >= 2')
    lengths = draw_lengths(w)
    B, K, S, W = w.prompts, w.responses, w.steps, w.warmup
    tokens = [float(lengths[s * B:(s + 1) * B].sum()) + w.prompt_len * B * K for s in range(S)]
    out: dict[str, ScheduleResult] = {}
    for name in schedules:
        if name not in SCHEDULES:
            raise ValueError(f'unknown schedule {name!r}')
        sim = _Sim(name, eng, tr, w, lengths)
        sim.run_all()
        ends = sim.step_end
        if any(math.isnan(e) for e in ends):
            raise RuntimeError(f'{name}: the simulation stalled')
        steps = [ends[0]] + [ends[s] - ends[s - 1] for s in range(1, S)]
        gen = [sim.batch_end[s] - sim.batch_start[s] for s in range(S + 1)]
        span = ends[-1] - ends[W - 1]
        train = sim.train_time
        if name == 'sync':
            ideal = [gen[s] + train[s] + tr.push_s for s in range(W, S)]
        elif name == 'k1':
            ideal = [max(gen[s + 1], train[s]) + tr.push_s for s in range(W, S)]
        else:
            ideal = [max(_gen_bound(eng, w, lengths, s), train[s]) + tr.push_s
                     for s in range(W, S)]
        num = den = 0.0
        worst = 0
        for s in range(W, S):
            for sid in range(s * B * K, (s + 1) * B * K):
                for n, v in sim.segments[sid]:
                    num += n * (s - v)
                    den += n
                    worst = max(worst, s - v)
        out[name] = ScheduleResult(
            step_s=span / (S - W), tokens_per_s=sum(tokens[W:]) / span,
            ideal_step_s=sum(ideal) / len(ideal), staleness_mean=num / den if den else 0.0,
            staleness_max=worst, step_times=steps, gen_s=gen[:S])
    if 'sync' in out:
        for r in out.values():
            r.speedup = r.tokens_per_s / out['sync'].tokens_per_s
    return out


# ---- calibration against a real run -------------------------------------------------------
def _fit_line(points: dict[float, float]) -> tuple[float, float]:
    """Least-squares ``y = intercept + slope * x`` through ``{x: y}`` (one point: slope 0)."""
    xs, ys = np.array(list(points), float), np.array(list(points.values()), float)
    if len(xs) == 1:
        return float(ys[0]), 0.0
    slope, intercept = np.polyfit(xs, ys, 1)
    return float(intercept), float(slope)


def calibrate(measured: dict) -> tuple[EngineParams, TrainerParams]:
    """Model constants from measurements of a real run.

    Args:
        measured: any of the keys ``a``, ``c``, ``p``, ``max_running``, ``t0``, ``t_tok``,
            ``ranks``, ``push_s`` (taken as they are), or the raw measurements they are
            fitted from:

            * ``decode_step_s``: ``{batch size b: seconds per decode iteration}``; fits
              ``a + c * b`` by least squares.
            * ``prefill_s``: ``{prompt tokens L: seconds of a lone prefill}``; ``p`` is the
              slope.
            * ``train_s``: ``{tokens per step: seconds of the update}``; fits
              ``t0 + slope * tokens`` and sets ``t_tok = slope * ranks``.

    Returns:
        ``(EngineParams, TrainerParams)``; what is not given keeps its default.
    """
    eng, tr = EngineParams(), TrainerParams()
    if 'decode_step_s' in measured:
        eng.a, eng.c = _fit_line(measured['decode_step_s'])
    if 'prefill_s' in measured:
        eng.p = _fit_line(measured['prefill_s'])[1]
    for key in ('a', 'c', 'p', 'max_running'):
        if key in measured:
            setattr(eng, key, type(getattr(eng, key))(measured[key]))
    for key in ('ranks', 'push_s'):
        if key in measured:
            setattr(tr, key, type(getattr(tr, key))(measured[key]))
    if 'train_s' in measured:
        tr.t0, slope = _fit_line(measured['train_s'])
        tr.t_tok = slope * tr.ranks
    for key in ('t0', 't_tok'):
        if key in measured:
            setattr(tr, key, float(measured[key]))
    return eng, tr


def predict(eng: EngineParams, tr: TrainerParams, w: Workload,
            schedules: tuple[str, ...] = SCHEDULES) -> dict[str, float]:
    """Predicted mean step time (s) per schedule: ``simulate(...)[name].step_s``.

    A real benchmark prints these next to its measured steps, e.g.
    ``predict(*calibrate({'decode_step_s': {1: .02, 8: .03}, 'train_s': {...},
    'push_s': .4}), Workload(servers=1, ...))``.
    """
    return {k: r.step_s for k, r in simulate(eng, tr, w, schedules).items()}


# ---- presets and CLI ----------------------------------------------------------------------
def areal_preset() -> tuple[EngineParams, TrainerParams, Workload]:
    """Settings after AReaL's 1.5B comparison (blog/AReaL_v0_3.md, Table 2: 16 nodes).

    Found: 1.5B model (R1-Distill-Qwen-1.5B), 16 nodes, 16 responses per prompt, a maximum
    generation length of 27K tokens (their coding recipe), batch size 2,048 (their
    hyper-parameter table), staleness ``eta <= 4`` costing little accuracy. Assumed: 8 GPUs
    a node (128 GPUs), one server per GPU, 3/4 of them serving (96) and 1/4 training (32);
    batch = 128 prompts x 16 = 2,048 responses; prompt 512 tokens; 'areal' lengths around a
    median of 6K tokens, ``p99 / p50 = 4`` within a prompt; engine and trainer constants of
    a 1.5B model on one H800: ``a = 12 ms``, ``c = 0.25 ms`` (attention over contexts of
    several thousand tokens folded into the per-sequence cost), ``p = 20 us``/token,
    ``max_running = 128``; ``t_tok = 60 us`` per token on one rank (about ``9 * 1.5e9``
    FLOPs per token for update + old-logprob + reference passes at ~25 % of the H800's
    dense bf16 peak), ``t0 = 10 s``; push 15 s. Their synchronous
    baseline runs generation and training on all GPUs in turn; ``--colocated-sync`` (set
    by this preset) gives ``sync`` all ``servers + ranks`` GPUs for both phases.
    """
    eng = EngineParams(a=0.012, c=2.5e-4, p=2e-5, max_running=128)
    tr = TrainerParams(t0=10.0, t_tok=6e-5, ranks=32, push_s=15.0)
    w = Workload(servers=96, prompts=128, responses=16, steps=12, warmup=2, prompt_len=512,
                 lengths='areal', median=6144, tail=4.0, max_new_tokens=27648,
                 max_staleness=4, seed=0)
    return eng, tr, w


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split('\n', 1)[0])
    d_e, d_t, d_w = EngineParams(), TrainerParams(), Workload()
    ap.add_argument('--preset', choices=('cluster', 'areal'), default='cluster')
    ap.add_argument('--schedules', default=','.join(SCHEDULES))
    ap.add_argument('--colocated-sync', action=argparse.BooleanOptionalAction, default=None,
                    help='sync uses servers + ranks GPUs for both generation and training')
    for name, default in [*dataclasses.asdict(d_e).items(), *dataclasses.asdict(d_t).items(),
                          *dataclasses.asdict(d_w).items()]:
        ap.add_argument('--' + name.replace('_', '-'), type=type(default), default=None,
                        help=f'default {default} (cluster preset)')
    return ap


def run_cli(args: argparse.Namespace) -> dict[str, ScheduleResult]:
    """Build the parameters from the preset and the flags, simulate, print."""
    if args.preset == 'areal':
        eng, tr, w = areal_preset()
        colocated = True if args.colocated_sync is None else args.colocated_sync
    else:
        eng, tr, w = EngineParams(), TrainerParams(), Workload()
        colocated = bool(args.colocated_sync)
    for obj in (eng, tr, w):
        for f in dataclasses.fields(obj):
            value = getattr(args, f.name, None)
            if value is not None:
                setattr(obj, f.name, value)
    schedules = tuple(s for s in args.schedules.split(',') if s)
    t_start = time.process_time()
    res = simulate(eng, tr, w, tuple(s for s in schedules if s != 'sync' or not colocated))
    if colocated and 'sync' in schedules:
        # Same GPUs, used in turn: every GPU serves, then every GPU trains.
        total = w.servers + tr.ranks
        w_all = dataclasses.replace(w, servers=total)
        tr_all = dataclasses.replace(tr, ranks=total)
        res = {'sync': simulate(eng, tr_all, w_all, ('sync',))['sync'], **res}
        for r in res.values():
            r.speedup = r.tokens_per_s / res['sync'].tokens_per_s
    cpu = time.process_time() - t_start
    print(f'workload servers={w.servers} ranks={tr.ranks} prompts={w.prompts} '
          f'responses={w.responses} steps={w.steps} warmup={w.warmup} lengths={w.lengths} '
          f'median={w.median} tail={w.tail} max_new_tokens={w.max_new_tokens} '
          f'max_staleness={w.max_staleness} colocated_sync={int(colocated)} seed={w.seed}')
    print(f'engine a={eng.a:g} c={eng.c:g} p={eng.p:g} max_running={eng.max_running} '
          f'trainer t0={tr.t0:g} t_tok={tr.t_tok:g} push_s={tr.push_s:g}')
    for name in SCHEDULES:
        if name in res:
            r = res[name]
            print(f'schedule={name:<14} tokens_per_s={r.tokens_per_s:.1f} step_s={r.step_s:.3f} '
                  f'ideal_step_s={r.ideal_step_s:.3f} speedup={r.speedup:.3f} '
                  f'staleness_mean={r.staleness_mean:.3f} staleness_max={r.staleness_max}')
    if args.preset == 'areal' and 'stream_partial' in res and 'sync' in res:
        hours = AREAL_BLOG_HOURS_1P5B
        print(f'areal simulated_stream_partial_over_sync={res["stream_partial"].speedup:.2f} '
              f'published={AREAL_PAPER_SPEEDUP_EARLY} (earlier arXiv abstract) '
              f'{AREAL_PAPER_SPEEDUP} (v2+) blog_1.5B={hours[0] / hours[1]:.2f} '
              f'({hours[0]} h / {hours[1]} h)')
    print(f'simulated_in_cpu_s={cpu:.2f} (a simulation, not a measurement)')
    return res


def main(argv: list[str] | None = None) -> int:
    run_cli(_parser().parse_args(argv))
    return 0


if __name__ == '__main__':
    sys.exit(main())
