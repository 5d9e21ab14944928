"""The transformers engine's scheduler: one thread that keeps a single running batch with a shared KV cache
(continuous batching). Queued requests are admitted between model steps (deterministic mode: only when every running
trajectory of their rollouts waits on the engine, in trajectory order), prefilled (each distinct prompt once, after
its cached prefix) and merged into the batch; each decode step samples one token per row; finished rows leave the
batch at once and their answers go out last. A request whose future was cancelled (its caller stopped waiting) is
aborted before the next step: it leaves the queue or the batch unanswered.

:class:`~lit_agentrl.engines.hf.TransformersEngine` is its API: requests in, weights updated between steps (the
scheduler's ``step_lock`` and :meth:`Scheduler.pause`), the model shared.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import queue
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache

from lit_agentrl.context import Admission, TrajectoryTag
from lit_agentrl.engines.base import GenerateResult
from lit_agentrl.engines.prefix_cache import CachedPrefix, PrefixCache
from lit_agentrl.engines.running_batch import RunningBatch, cache_with_prefixes, select_rows
from lit_agentrl.engines.sampling import SamplingParams, sample_tokens

log = logging.getLogger(__name__)


@dataclass
class RequestImages:
    """A vision-language request's images as the model takes them, and its M-RoPE positions."""

    pixel_values: torch.Tensor  # [N, D]: every image's patches
    grids: torch.Tensor  # [k, 3]
    patches: list[int]  # rows of pixel_values per image
    spans: list[tuple[int, int]]  # each image's tokens in the prompt: [start, end)
    digests: tuple[str, ...]  # the images' identity: the prefix cache's scope
    positions: torch.Tensor  # [3, P]: the whole prompt's rotary positions
    rope_delta: int  # positions after the prompt: index + rope_delta


@dataclass
class EngineRequest:
    input_ids: list[int]
    params: SamplingParams
    return_logprob: bool
    future: concurrent.futures.Future
    rng: random.Random
    stop_window: int = 0  # trailing output tokens decoded to look for stop strings (0: none)
    tag: TrajectoryTag | None = None  # the rollout trajectory that sent it (see engines.admission)
    order: tuple[Any, ...] = ()  # its place in an admission: by trajectory and turn, not arrival
    images: RequestImages | None = None  # a vision-language request's images
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    counts: torch.Tensor | None = None  # [V]: how often this request generated each token (penalties only)

    @property
    def next_position(self) -> int:
        """Position of the last sampled token, the one fed to the next decode step (M-RoPE: in every component)."""
        delta = self.images.rope_delta if self.images is not None else 0
        return len(self.input_ids) + len(self.output_ids) - 1 + delta

    @property
    def scope(self) -> tuple[str, ...]:
        """Its images' digests (empty for text): what its KV depends on besides the token ids."""
        return self.images.digests if self.images is not None else ()


class Scheduler:
    """The scheduler thread of one engine (see the module's docstring).

    Args:
        model: the engine's model (shared: the engine updates its weights under :attr:`step_lock`).
        device: where the model runs.
        cache_kwarg: the model's name for its KV cache argument (``cache`` in transformers 5, else
            ``past_key_values``).
        eos_token_ids: tokens that end a request unless it ignores EOS.
        vision: whether the model takes images (M-RoPE positions, pixel values).
        prefix_cache: finished requests' KV, for the turns that extend them (None: off).
        max_running_requests: most rows in the running batch.
        deterministic: admit by trajectory order at quiescent points, not by arrival.
        admission_window_s, max_admission_wait_s: when idle, how long to keep gathering arriving requests.
        weight_version: the engine's weight version now (recorded on each request's trajectory).
        decode: output tokens to text, for stop strings.
    """

    def __init__(
        self,
        model: Any,
        device: torch.device,
        cache_kwarg: str,
        eos_token_ids: frozenset[int],
        vision: bool,
        prefix_cache: PrefixCache | None,
        *,
        max_running_requests: int,
        deterministic: bool,
        admission_window_s: float,
        max_admission_wait_s: float,
        weight_version: Callable[[], int],
        decode: Callable[[list[int]], str],
    ) -> None:
        self.model, self.device, self.cache_kwarg = model, device, cache_kwarg
        self.eos_token_ids, self.vision, self.prefix_cache = eos_token_ids, vision, prefix_cache
        self.max_running_requests, self.deterministic = max_running_requests, deterministic
        self.admission_window_s, self.max_admission_wait_s = admission_window_s, max_admission_wait_s
        self.weight_version, self.decode = weight_version, decode
        self.busy_seconds = 0.0  # model compute so far (prefills, decode steps, sampling), for the step breakdown
        self.sampled_tokens = 0  # tokens sampled so far over every request (see wait_for_sampled_tokens)
        self.aborted_requests = 0  # requests dropped because their callers stopped waiting (wait_for_aborted_requests)
        self.running_requests = 0  # rows in the running batch (as of the last step, or the last rows to leave)
        self.step_lock = threading.Lock()  # held for each model step and for each weight update
        self.stopped = False
        self._progress = threading.Condition()
        self._waiting: queue.Queue[EngineRequest | None] = queue.Queue()
        self._paused = False  # a weight update is in progress: no model step starts (pause/resume)
        self._pause = threading.Condition()
        self._gate: Admission | None = None  # the rollout whose requests were admitted last
        self._thread = threading.Thread(target=self._serve, name="TransformersEngine", daemon=True)
        self._thread.start()

    def submit(self, request: EngineRequest) -> None:
        """Queue ``request``; its trajectory then waits on the engine."""
        self._waiting.put(request)
        if request.tag is not None:  # after the put: once the gate is quiescent, every request it counted is queued
            request.tag.gate.submitted(request.tag.key)

    def pause(self) -> None:
        """Hold model steps from the one in progress (which finishes first) until :meth:`resume`."""
        with self._pause:
            self._paused = True
        with self.step_lock:
            pass

    def resume(self) -> None:
        with self._pause:
            self._paused = False
            self._pause.notify_all()

    def wait_for_sampled_tokens(self, count: int, timeout: float | None = None) -> bool:
        """Block until ``count`` tokens have been sampled in all (False: timed out, or stopped first)."""
        with self._progress:
            self._progress.wait_for(lambda: self.sampled_tokens >= count or self.stopped, timeout)
            return self.sampled_tokens >= count

    def wait_for_aborted_requests(self, count: int, timeout: float | None = None) -> bool:
        """Block until ``count`` requests have been aborted in all (False: timed out, or stopped first)."""
        with self._progress:
            self._progress.wait_for(lambda: self.aborted_requests >= count or self.stopped, timeout)
            return self.aborted_requests >= count

    def stop(self) -> None:
        """Stop the thread; queued and running requests fail with ``RuntimeError``."""
        if self.stopped:
            return
        self.stopped = True
        self.resume()
        with self._progress:
            self._progress.notify_all()
        self._waiting.put(None)
        self._thread.join(timeout=30)

    def _serve(self) -> None:
        batch: RunningBatch[EngineRequest] = RunningBatch()
        pending: collections.deque[EngineRequest] = collections.deque()
        admission_point = True  # idle, or requests finished in the last step (deterministic mode admits only then)
        while self._drain_queue(pending, block=not (batch.requests or pending)):
            self._abort_cancelled(batch, pending)
            admitted = self._admit(pending, len(batch.requests), admission_point)
            with self._pause:  # a weight update in progress: the next step waits for all of it
                self._pause.wait_for(lambda: not self._paused or self.stopped)
            finished = 0
            try:
                with self.step_lock, torch.inference_mode():
                    start = time.perf_counter()
                    if admitted:
                        finished += self._prefill(batch, admitted)
                    if batch.requests:
                        finished += self._decode(batch)
                    self.busy_seconds += time.perf_counter() - start
            except Exception as exc:  # a model error fails the requests in flight, never the thread
                log.exception("TransformersEngine step failed")
                for request in {id(r): r for r in batch.requests + admitted}.values():  # admitted ones may be merged
                    deliver(request, error=exc)
                batch, finished = RunningBatch(), 1
            self.running_requests = len(batch.requests)
            admission_point = finished > 0 or not batch.requests
        stopped = RuntimeError("TransformersEngine has been shut down")
        for request in [*batch.requests, *pending]:
            deliver(request, error=stopped)
        while not self._waiting.empty():
            item = self._waiting.get_nowait()
            if item is not None:
                deliver(item, error=stopped)

    def _abort_cancelled(self, batch: RunningBatch[EngineRequest], pending: collections.deque[EngineRequest]) -> None:
        """Drop the requests whose callers stopped waiting (their futures cancelled: a trajectory's timeout), queued or
        running, so no step computes them again. Their KV goes with their rows; none of it is kept in the prefix cache,
        since nothing will extend a trajectory that ended."""
        queued = [r for r in pending if r.future.cancelled()]
        rows = [row for row, r in enumerate(batch.requests) if r.future.cancelled()]
        if not queued and not rows:
            return
        running = [batch.requests[row] for row in rows]
        for request in queued:
            pending.remove(request)
        if rows:
            batch.drop(rows)
        self.running_requests = len(batch.requests)
        for request in queued + running:
            if request.tag is not None:  # the gate's books: it no longer waits on the engine
                request.tag.gate.answered(request.tag.key)
        with self._progress:
            self.aborted_requests += len(queued) + len(running)
            self._progress.notify_all()

    def _admit(
        self, pending: collections.deque[EngineRequest], running: int, admission_point: bool
    ) -> list[EngineRequest]:
        """The pending requests that join the running batch now (as many as there is room for).

        Deterministic mode admits only at admission points, once every running trajectory of the rollouts the
        requests come from waits on the engine, and then in trajectory order: so which requests share a step does
        not depend on when they arrived.
        """
        if self.deterministic:
            if not admission_point:
                return []
            gates = {r.tag.gate for r in pending if r.tag is not None}
            if self._gate is not None and not self._gate.finished:
                gates.add(self._gate)
            for gate in gates:
                if not self._wait_quiescent(gate):
                    return []
            if gates:
                self._drain_queue(pending, block=False)
            ordered = sorted(pending, key=lambda r: r.order)
            pending.clear()
            pending.extend(ordered)
        room = self.max_running_requests - running
        admitted = [pending.popleft() for _ in range(min(room, len(pending)))]
        self._gate = next((r.tag.gate for r in reversed(admitted) if r.tag is not None), self._gate)
        return admitted

    def _wait_quiescent(self, gate: Admission) -> bool:
        """Wait until the gate is quiescent; False when the engine shuts down meanwhile."""
        while not gate.wait_quiescent(timeout=0.1):
            if self.stopped:
                return False
        return True

    def _drain_queue(self, pending: collections.deque[EngineRequest], block: bool) -> bool:
        """Move queued requests into ``pending``; False once shut down.

        When idle (``block``), wait for a first request, then keep gathering while requests keep arriving
        within ``admission_window_s``: agents submit their requests one by one, and one prefill over many
        of them costs far less than many prefills over few.
        """
        deadline = None
        try:
            item = self._waiting.get(block=block)
            while True:
                if item is None:  # shut down; put back, so that every later drain sees it too (one in _admit may
                    self._waiting.put(None)  # take it first, and the loop's next, blocking drain must not wait)
                    return False
                pending.append(item)
                if block and deadline is None:
                    deadline = time.monotonic() + self.max_admission_wait_s
                wait = min(self.admission_window_s, deadline - time.monotonic()) if deadline else 0.0
                item = self._waiting.get(timeout=wait) if wait > 0 else self._waiting.get_nowait()
        except queue.Empty:
            return True

    def _prefill(self, batch: RunningBatch[EngineRequest], admitted: list[EngineRequest]) -> int:
        """Prefill the admitted prompts into the running batch: each distinct prompt once, after its cached prefix."""
        for request in admitted:
            self._note_version(request)
        distinct: dict[tuple[tuple[str, ...], tuple[int, ...]], int] = {}
        firsts: list[EngineRequest] = []  # one request per distinct prompt (and images)
        rows = []
        for r in admitted:
            key = (r.scope, tuple(r.input_ids))
            if key not in distinct:
                distinct[key] = len(distinct)
                firsts.append(r)
            rows.append(distinct[key])
        prompts = [list(ids) for _, ids in distinct]
        cached = [
            self.prefix_cache.pop_longest_prefix(r.input_ids, r.scope) if self.prefix_cache is not None else None
            for r in firsts
        ]
        if not self.vision:
            cache, mask, logits = self._forward_prompts(prompts, cached)
        else:
            cached = [_whole_images(c, r.images) for c, r in zip(cached, firsts)]
            cache, mask, logits = self._forward_prompts(prompts, cached, [r.images for r in firsts])
        if len(prompts) < len(admitted):  # copies of one prompt share its prefill
            index = torch.tensor(rows, device=self.device)
            select_rows(cache, index)
            mask, logits = mask.index_select(0, index), logits.index_select(0, index)
        batch.merge(admitted, cache, mask)
        return self._sample_and_finish(
            batch, logits, rows=range(len(batch.requests) - len(admitted), len(batch.requests))
        )

    def _forward_prompts(
        self,
        prompts: list[list[int]],
        cached: list[CachedPrefix | None],
        images: list[RequestImages | None] | None = None,
    ) -> tuple[DynamicCache, torch.Tensor, torch.Tensor]:
        """One forward over the prompts' uncached tokens; returns the KV cache, its mask and last logits.

        Row layout: [padding, cached prefix | padding, new tokens], the cached part left-padded to the longest
        prefix and the new part to the longest remainder; padding is masked out, positions count real tokens.
        ``images`` (a vision-language model's, one entry per prompt): 3-D positions, and the pixel values of the
        images among each row's new tokens.
        """
        past = max((c.length for c in cached if c is not None), default=0)
        news = [p[c.length :] if c is not None else p for p, c in zip(prompts, cached)]
        width = max(map(len, news))
        ids = torch.zeros((len(prompts), width), dtype=torch.long)
        # M-RoPE positions are [3, B, W] (a text row's three components are equal); plain ones [B, W].
        components = () if images is None else (3,)
        positions = torch.zeros((*components, len(prompts), width), dtype=torch.long)
        mask = torch.zeros((len(prompts), past + width), dtype=torch.long)
        pixels: list[torch.Tensor] = []
        grids: list[torch.Tensor] = []
        for row, (prompt, new, hit) in enumerate(zip(prompts, news, cached)):
            reused = hit.length if hit is not None else 0
            ids[row, width - len(new) :] = torch.tensor(new)
            seen = images[row] if images is not None else None
            if seen is None:
                positions[..., row, width - len(new) :] = torch.arange(reused, reused + len(new))
            else:
                positions[:, row, width - len(new) :] = seen.positions[:, reused : len(prompt)]
                offsets = [0, *torch.tensor(seen.patches).cumsum(0).tolist()]
                for k, (start, _) in enumerate(seen.spans):
                    if start >= reused:  # an image in the new tokens (one in the cached part has its KV there)
                        pixels.append(seen.pixel_values[offsets[k] : offsets[k + 1]])
                        grids.append(seen.grids[k])
            mask[row, past - reused : past] = 1
            mask[row, past + width - len(new) :] = 1
        cache = cache_with_prefixes(cached, past)
        mask = mask.to(self.device)
        vision: dict[str, Any] = {}
        if pixels:
            vision = {
                "pixel_values": torch.cat(pixels).to(self.device, self.model.dtype),
                "image_grid_thw": torch.stack(grids).to(self.device),
            }
        logits = self.model(
            input_ids=ids.to(self.device),
            attention_mask=mask,
            position_ids=positions.to(self.device),
            **{self.cache_kwarg: cache},
            use_cache=True,
            logits_to_keep=1,
            **vision,
        ).logits[:, -1, :]
        return cache, mask, logits

    def _decode(self, batch: RunningBatch[EngineRequest]) -> int:
        last = torch.tensor([[r.output_ids[-1]] for r in batch.requests], device=self.device)
        positions = torch.tensor([[r.next_position] for r in batch.requests], device=self.device)
        logits = self.model(
            input_ids=last,
            attention_mask=batch.step_mask(),
            position_ids=positions,
            **{self.cache_kwarg: batch.cache},
            use_cache=True,
        ).logits[:, -1, :]
        return self._sample_and_finish(batch, logits, rows=range(len(batch.requests)))

    def _sample_and_finish(self, batch: RunningBatch[EngineRequest], logits: torch.Tensor, rows: range) -> int:
        """Sample a token for each of ``rows``; finished requests get their results and leave the batch. Returns
        how many finished."""
        requests = [batch.requests[i] for i in rows]
        uniforms = torch.tensor([r.rng.random() for r in requests], device=logits.device)
        counts = self._generated_counts(requests, logits)
        tokens, logprobs = sample_tokens(logits.float(), [r.params for r in requests], uniforms, counts)
        finished: list[tuple[int, EngineRequest, dict[str, Any]]] = []
        for row, request, token, logprob in zip(rows, requests, tokens.tolist(), logprobs.tolist()):
            request.output_ids.append(token)
            request.logprobs.append(logprob)
            if request.counts is not None:
                request.counts[token] += 1
            reason = self._finish_reason(request, token)
            if reason is not None:
                finished.append((row, request, reason))
        with self._progress:
            self.sampled_tokens += len(requests)
            self._progress.notify_all()
        if not finished:
            return 0
        if self.prefix_cache is not None:  # every token fed so far: the prompt and all but the last output
            for row, request, _ in finished:
                self.prefix_cache.store(request.input_ids + request.output_ids[:-1], batch.row_kv(row), request.scope)
        batch.drop([row for row, _, _ in finished])
        self.running_requests = len(batch.requests)  # before the answers: a caller woken by one sees it
        # Results go out last: each wakes an agent on the event loop, whose Python would then contend for the GIL
        # with this thread's many small tensor operations (measured: 1 s of a 1.9 s multi-turn rollout).
        for _, request, reason in finished:
            request.counts = None
            self._note_version(request)
            deliver(request, self.result(request, reason))
        return len(finished)

    def _note_version(self, request: EngineRequest) -> None:
        """Record the weights' version on the request's trajectory (at admission and at its last token)."""
        if request.tag is not None:
            request.tag.gate.note_version(request.tag.key, self.weight_version())

    @staticmethod
    def _generated_counts(requests: list[EngineRequest], logits: torch.Tensor) -> torch.Tensor | None:
        """[B, V] counts of each row's generated tokens when any row has a penalty (rows without one: zeros), else
        None. Each penalised request keeps its own counts, from its first sampled token on, wherever its row goes.
        """
        penalised = [i for i, r in enumerate(requests) if r.params.penalised]
        if not penalised:
            return None
        counts = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
        for i in penalised:
            request = requests[i]
            if request.counts is None:  # first token: nothing generated yet (prompts are not counted)
                request.counts = counts.new_zeros(logits.shape[-1])
            counts[i] = request.counts
        return counts

    def _finish_reason(self, request: EngineRequest, token: int) -> dict[str, Any] | None:
        params = request.params
        # Stop strings come first, ignore_eos or not (schedule_batch.py 2023-2043: strings, then tokens, then length).
        if request.stop_window:
            matched = self._matched_stop_string(request)
            if matched is not None:
                return {"type": "stop", "matched": matched}
        # As in SGLang, ignore_eos turns off every token-based stop, stop_token_ids included.
        if not params.ignore_eos and (token in params.stop_token_ids or token in self.eos_token_ids):
            return {"type": "stop", "matched": token}
        if len(request.output_ids) >= params.max_new_tokens:
            return {"type": "length", "length": len(request.output_ids)}
        return None

    def _matched_stop_string(self, request: EngineRequest) -> str | None:
        """The first of the request's stop strings in its decoded last ``stop_window`` output tokens, if any.

        SGLang's ``Req.tail_str`` / ``_check_str_based_finish`` (``sglang/srt/managers/schedule_batch.py`` 1807-1830,
        1911-1932): the
        window is the longest stop string's length in tokens plus one, so a string spelled by more tokens than its
        own encoding has can be missed, as SGLang misses it; an empty string matches at once.
        """
        tail = self.decode(request.output_ids[-request.stop_window :])
        return next((s for s in request.params.stop if s in tail), None)

    def result(self, request: EngineRequest, finish_reason: dict[str, Any]) -> GenerateResult:
        meta: dict[str, Any] = {
            "finish_reason": finish_reason,
            "prompt_tokens": len(request.input_ids),
            "completion_tokens": len(request.output_ids),
            "weight_version": self.weight_version(),  # at the last token, as SGLang reports it
        }
        if request.return_logprob:
            meta["output_token_logprobs"] = [(lp, t, None) for lp, t in zip(request.logprobs, request.output_ids)]
        return {"output_ids": list(request.output_ids), "meta_info": meta}


def _whole_images(hit: CachedPrefix | None, images: RequestImages | None) -> CachedPrefix | None:
    """``hit``, unless it ends inside an image's tokens (an image is encoded whole, never in part): then None."""
    if hit is None or images is None:
        return hit
    if any(start < hit.length < end for start, end in images.spans):
        return None
    return hit


def deliver(request: EngineRequest, result: GenerateResult | None = None, error: BaseException | None = None) -> None:
    """Hand a request its answer; its trajectory counts as running again first (see engines.admission)."""
    if request.tag is not None:
        request.tag.gate.answered(request.tag.key)
    try:
        if error is not None:
            request.future.set_exception(error)
        else:
            request.future.set_result(result)
    except concurrent.futures.InvalidStateError:  # cancelled by its caller (a trajectory's timeout) meanwhile
        pass
