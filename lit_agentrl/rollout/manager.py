"""The rollout manager: many agent trajectories in flight over one or more engines.

Each (row, sample) pair runs its agent graph as its own task: trajectories of different lengths and turn
counts overlap freely, so a slow tool call or a long answer never holds up the rest of the batch.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import math
import statistics
import threading
import time
import traceback
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from lit_agentrl.agents.base import MESSAGES_FIELD, AgentGraph, AgentGraphOutput
from lit_agentrl.agents.config import load_agent_cfg
from lit_agentrl.agents.registry import get_agent_class
from lit_agentrl.config.rollout import DEFAULT_TRAJECTORY_TIMEOUT_S
from lit_agentrl.config.sampling import SamplingParams
from lit_agentrl.context import TrajectoryContext, TrajectoryTag, enter_trajectory
from lit_agentrl.engines.admission import AdmissionGate
from lit_agentrl.engines.base import RolloutEngine
from lit_agentrl.loop_services import stop_loop_services
from lit_agentrl.rewards import RewardFn, resolve_reward_fn
from lit_agentrl.rollout.background import BackgroundLoop
from lit_agentrl.rollout.faults import raise_reported_faults
from lit_agentrl.rollout.judge import JUDGE_FIELD, LLMJudge, judge_reward
from lit_agentrl.rollout.tail import GroupedRollout
from lit_agentrl.rows import agent_run_kwargs
from lit_agentrl.turns import turn_spans
from lit_agentrl.types import AGENT_METRICS_FIELD, RolloutBatch, RolloutStats, Trajectory

DEFAULT_REWARD_WORKERS = 4
"""Reward threads per manager: enough for a few slow rewards at once, few enough to leave the event loop its turns
(rewards are mostly pure Python and share the interpreter lock with it)."""


class RolloutManager:
    """Run agent graphs for prompt rows: routing, concurrency, balancing, timeouts, rewards, statistics.

    Args:
        engines: one or more rollout engines (SGLang's ``Engine`` API); trajectories go to the engine
            with the fewest outstanding trajectories.
        tokenizer: the policy tokenizer, handed to every graph.
        processor: handed to every graph; kept for the seed's signature and for vision-language agents; None for
            text models.
        max_inflight_per_engine: most trajectories running at once against one engine.
        trajectory_timeout_s: a trajectory running longer is cancelled, its engine requests with it, and marked
            failed (default :data:`DEFAULT_TRAJECTORY_TIMEOUT_S`; None: no limit, on purpose).
        reward_fn: name of the reward function for rows whose ``data_source`` names none and whose agent
            sets no ``reward_score`` (see :mod:`lit_agentrl.rewards`).
        check_template_drift: re-render each finished conversation through the chat template and count
            where it differs from the accumulated ids (``rollout/template_drift``; costs a render per trajectory).
        reward_workers: threads that run reward functions, off the event loop and apart from the loop's default
            executor (which agents use for their own blocking work), so a slow reward holds up neither.

    Example::

        manager = RolloutManager([engine], tokenizer, reward_fn="math")
        batch = manager.generate(rows, n_samples=4, sampling_params=SamplingParams(max_new_tokens=256))
    """

    def __init__(
        self,
        engines: Sequence[RolloutEngine],
        tokenizer: Any,
        processor: Any = None,
        max_inflight_per_engine: int = 256,
        trajectory_timeout_s: float | None = DEFAULT_TRAJECTORY_TIMEOUT_S,
        reward_fn: str | None = None,
        check_template_drift: bool = True,
        reward_workers: int = DEFAULT_REWARD_WORKERS,
        judge: LLMJudge | None = None,
    ) -> None:
        if not engines:
            raise ValueError("RolloutManager needs at least one engine")
        if max_inflight_per_engine < 1:
            raise ValueError(f"max_inflight_per_engine must be >= 1, got {max_inflight_per_engine}")
        if trajectory_timeout_s is not None and trajectory_timeout_s <= 0:
            raise ValueError(f"trajectory_timeout_s must be > 0 or None, got {trajectory_timeout_s}")
        if reward_workers < 1:
            raise ValueError(f"reward_workers must be >= 1, got {reward_workers}")
        self.engines = list(engines)
        self.tokenizer = tokenizer
        self.processor = processor
        self.max_inflight_per_engine = max_inflight_per_engine
        self.trajectory_timeout_s = trajectory_timeout_s
        self.reward_fn = reward_fn
        self.judge = judge
        self.check_template_drift = check_template_drift
        self._graphs: dict[tuple[str, str | None, int], AgentGraph] = {}
        self._outstanding = [0] * len(self.engines)
        self.reward_seconds = 0.0  # reward functions' run time so far, summed over the reward threads
        self._loop: asyncio.AbstractEventLoop | None = None
        self.reward_workers = reward_workers
        self._reward_pool: ThreadPoolExecutor | None = None  # started on the first reward, stopped by close()
        self._reward_lock = threading.Lock()  # guards reward_seconds, added to from the reward threads
        self._background: BackgroundLoop | None = None  # started by the first submit()

    # ------------------------------------------------------------------ entry points

    def generate(
        self,
        rows: Sequence[Mapping[str, Any]],
        n_samples: int,
        sampling_params: SamplingParams | Mapping[str, Any],
        seed: int | None = None,
    ) -> RolloutBatch:
        """Blocking :meth:`agenerate` on one event loop kept across calls: the background loop once
        :meth:`submit` has started it, else the engine's own when it has one (an in-process SGLang engine serves
        every request from its loop), else the manager's."""
        if self._background is not None:
            return self.submit(rows, n_samples, sampling_params, seed).result()
        if self._loop is None or self._loop.is_closed():
            engine_loop = next((e.loop for e in self.engines if e.loop is not None), None)
            self._loop = engine_loop or asyncio.new_event_loop()
        return self._loop.run_until_complete(self.agenerate(rows, n_samples, sampling_params, seed))

    def submit(
        self,
        rows: Sequence[Mapping[str, Any]],
        n_samples: int,
        sampling_params: SamplingParams | Mapping[str, Any],
        seed: int | None = None,
    ) -> concurrent.futures.Future[RolloutBatch]:
        """Start :meth:`agenerate` on the manager's background thread and return at once (rollouts beside the
        trainer, ``RolloutCallback.async_rollouts``). Needs engines that can generate beside the trainer; from the
        first call on, :meth:`generate` runs on that thread too."""
        return self.start_background().submit(self.agenerate(rows, n_samples, sampling_params, seed))

    def submit_groups(
        self,
        rows: Sequence[Mapping[str, Any]],
        n_samples: int,
        sampling_params: SamplingParams | Mapping[str, Any],
        seed: int | None = None,
    ) -> GroupedRollout:
        """:meth:`submit` with a future per row (its ``n_samples`` trajectories), so a step may take the groups that
        have finished and leave the rest running (``async_rollouts.ready_fraction``, :mod:`lit_agentrl.rollout.tail`)."""
        gate, params = self._checked_gate(len(rows), n_samples, sampling_params)
        background = self.start_background()
        groups = [self._group(rows[g], g, n_samples, gate, params, seed) for g in range(len(rows))]
        return GroupedRollout([background.submit(group) for group in groups])

    def start_background(self) -> BackgroundLoop:
        """The background thread's loop, started on first use (refused for engines that cannot serve it)."""
        if self._background is None:
            self._background = BackgroundLoop(self.engines)
        return self._background

    async def agenerate(
        self,
        rows: Sequence[Mapping[str, Any]],
        n_samples: int,
        sampling_params: SamplingParams | Mapping[str, Any],
        seed: int | None = None,
    ) -> RolloutBatch:
        """``n_samples`` trajectories per row, row-major, with their statistics. ``seed`` seeds the rollout's
        sampling streams (with each trajectory's key) on engines that take it, whatever else runs beside it."""
        gate, params = self._checked_gate(len(rows), n_samples, sampling_params)
        start, rewards_before = time.perf_counter(), self.reward_seconds
        groups = [self._group(rows[g], g, n_samples, gate, params, seed) for g in range(len(rows))]
        trajectories = [t for group in await asyncio.gather(*groups) for t in group]
        stats = summarize(trajectories, time.perf_counter() - start)
        stats.reward_seconds = self.reward_seconds - rewards_before  # with rollouts beside it, theirs too
        return RolloutBatch(trajectories, stats, params.temperature)

    def _checked_gate(
        self, num_rows: int, n_samples: int, sampling_params: SamplingParams | Mapping[str, Any]
    ) -> tuple[AdmissionGate, SamplingParams]:
        """The rollout's admission gate and its sampling parameters, checked before any trajectory starts."""
        if n_samples < 1:
            raise ValueError(f"n_samples must be >= 1, got {n_samples}")
        params = SamplingParams.of(sampling_params)
        return self._gate([(group, sample) for group in range(num_rows) for sample in range(n_samples)]), params

    async def _group(
        self,
        row: Mapping[str, Any],
        group: int,
        n_samples: int,
        gate: AdmissionGate,
        sampling_params: SamplingParams,
        seed: int | None,
    ) -> list[Trajectory]:
        """The ``n_samples`` trajectories of one row."""
        tags = [TrajectoryTag(gate, (group, sample), seed) for sample in range(n_samples)]
        trajectories = list(await asyncio.gather(*(self._run_one(row, tag, sampling_params) for tag in tags)))
        if self.judge is not None and self.judge.ranks:
            await self._rank(row, [t for t in trajectories if _awaits_ranking(t)])
        return trajectories

    async def _rank(self, row: Mapping[str, Any], trajectories: list[Trajectory]) -> None:
        """A ranking judge's scores for the group's finished trajectories (one call); its fault fails them all."""
        if not trajectories or self.judge is None:
            return
        try:
            scores, record = await self.judge.rank(dict(row), [t.str_output for t in trajectories])
        except Exception as exc:
            for t in trajectories:
                t.failed, t.failure_reason = True, f"{type(exc).__name__}: {exc}"
            return
        for index, (t, score) in enumerate(zip(trajectories, scores)):
            t.reward = score + sum(t.turn_rewards or ())
            t.extra_fields[JUDGE_FIELD] = {**record, "response": index + 1, "score": score}

    def close(self) -> None:
        """Stop the services its agents started on its loops (the OpenAI gateways), the background thread (cancelling
        its rollouts), the reward threads and the manager's event loop (engines, and their loops, are owned and shut
        down by the caller)."""
        for loop in (self._background.loop if self._background is not None else None, self._loop):
            if loop is not None:
                stop_loop_services(loop)
        if self._background is not None:
            self._background.stop()
            self._background = None
        if self._reward_pool is not None:
            self._reward_pool.shutdown(wait=True)
            self._reward_pool = None
        if self.judge is not None:
            self.judge.close()
        if any(self._loop is e.loop for e in self.engines):
            return
        if self._loop is not None and not self._loop.is_closed():
            self._loop.run_until_complete(self._loop.shutdown_default_executor())
            self._loop.close()

    # ------------------------------------------------------------------ one trajectory

    async def _run_one(self, row: Mapping[str, Any], tag: TrajectoryTag, sampling_params: SamplingParams) -> Trajectory:
        (group, sample), agent_name = tag.key, str(row.get("agent_name"))
        # This trajectory's task only: a ChatModel called without sampling params uses these, every request carries
        # the trajectory's tag (engines.admission), and set-up faults fail it even when the agent catches them.
        faults = enter_trajectory(TrajectoryContext(tag, sampling_params)).faults
        start = time.perf_counter()
        await tag.gate.acquire(tag.key)
        engine_index = self._route(group)
        tag.gate.note_version(tag.key, self.engines[engine_index].weight_version)
        self._outstanding[engine_index] += 1
        try:
            try:
                start = time.perf_counter()
                graph = self._graph(row, engine_index)
                kwargs = agent_run_kwargs(row)
                run = graph.run(sampling_params=sampling_params, **kwargs)
                output = await asyncio.wait_for(run, self.trajectory_timeout_s)
                raise_reported_faults(faults)
                if not isinstance(output, AgentGraphOutput):
                    raise TypeError(
                        f"{type(graph).__name__}.run returned {type(output).__name__}, not AgentGraphOutput"
                    )
                check_output(output)
            finally:
                self._outstanding[engine_index] -= 1
                tag.gate.release(tag.key)
            reward = await self._reward(output, row, kwargs["ground_truth"])  # the engine slot is free meanwhile
        except TimeoutError:
            reason = f"timeout: trajectory exceeded {self.trajectory_timeout_s}s"
            return Trajectory(group, sample, agent_name, failed=True, failure_reason=reason, seconds=_since(start))
        except Exception as exc:  # one trajectory's fault is counted, never fatal to the batch
            reason = f"{type(exc).__name__}: {exc}"
            return Trajectory(
                group,
                sample,
                agent_name,
                failed=True,
                failure_reason=reason,
                failure_traceback=_traceback_with_agent_line(exc, agent_name),
                seconds=_since(start),
            )
        trajectory = _to_trajectory(output, group, sample, agent_name, reward, _since(start))
        trajectory.weight_versions = tag.gate.versions(tag.key)
        return trajectory

    @property
    def _fixed_routes(self) -> bool:
        """Whether each trajectory's engine is fixed by its group: when every engine is deterministic, which engine
        serves it must not depend on timing either (a group's prompts then share one engine's prefix cache)."""
        return all(getattr(engine, "deterministic", False) for engine in self.engines)

    def _gate(self, keys: list[tuple[int, int]]) -> AdmissionGate:
        """The rollout's gate: a lane of ``max_inflight_per_engine`` slots per engine with fixed routes, else one
        lane of them all (an engine is chosen when a trajectory gets its slot)."""
        if self._fixed_routes:
            lanes = [[k for k in keys if k[0] % len(self.engines) == e] for e in range(len(self.engines))]
            return AdmissionGate(lanes, self.max_inflight_per_engine)
        return AdmissionGate([keys], self.max_inflight_per_engine * len(self.engines))

    def _route(self, group: int) -> int:
        """The engine for a trajectory that has its slot: its group's with fixed routes, else the one with the
        fewest trajectories running (at most ``max_inflight_per_engine`` each: the slots are as many)."""
        if self._fixed_routes:
            return group % len(self.engines)
        return min(range(len(self.engines)), key=self._outstanding.__getitem__)

    def _graph(self, row: Mapping[str, Any], engine_index: int) -> AgentGraph:
        """The graph for the row's agent and config on this engine, built once."""
        agent_name, cfg_path = row["agent_name"], row.get("agent_cfg_path") or None
        key = (agent_name, cfg_path, engine_index)
        if key not in self._graphs:
            cls = get_agent_class(agent_name)
            graph = cls(
                agent_name,
                load_agent_cfg(cfg_path),
                self.engines[engine_index],
                self.tokenizer,
                processor=self.processor,
            )
            graph.check_template_drift = self.check_template_drift
            self._graphs[key] = graph
        return self._graphs[key]

    async def _reward(self, output: AgentGraphOutput, row: Mapping[str, Any], ground_truth: Any) -> float:
        """The agent's own reward when set, else the row's reward function on the output text, run in a reward
        thread: while it runs, the event loop goes on with the other trajectories."""
        if output.reward_score is not None:
            return float(output.reward_score)
        reward_fn = resolve_reward_fn(row, self.reward_fn)
        if reward_fn is None:
            raise ValueError(
                f"no reward for agent {row.get('agent_name')!r}: it set no reward_score and no reward function "
                f"matches data_source={row.get('data_source')!r} (set RolloutCallback.reward)"
            )
        if reward_fn is judge_reward and self.judge is not None:  # asked from this loop: judging overlaps generation
            if self.judge.ranks:  # scored with its group (_rank): a NaN until then, never a silent number
                output.extra_fields[JUDGE_FIELD] = {"awaiting_ranking": True}
                return math.nan
            score, record = await self.judge.score(dict(row), output.str_output)
            output.extra_fields[JUDGE_FIELD] = record
            return score
        fields = {k: v for k, v in row.items() if k != "ground_truth"}
        call = functools.partial(self._timed_reward, reward_fn, output.str_output, ground_truth, fields)
        return await asyncio.get_running_loop().run_in_executor(self._reward_executor(), call)

    def _timed_reward(self, reward_fn: RewardFn, completion: str, ground_truth: Any, fields: dict[str, Any]) -> float:
        """One reward call, in a reward thread; its own run time (not its wait for a thread) counts in
        ``time/reward_s``, summed over the calls."""
        start = time.perf_counter()
        try:
            return float(reward_fn(completion, ground_truth, **fields))
        finally:
            with self._reward_lock:
                self.reward_seconds += _since(start)

    def _reward_executor(self) -> ThreadPoolExecutor:
        if self._reward_pool is None:
            self._reward_pool = ThreadPoolExecutor(self.reward_workers, thread_name_prefix="lit-agentrl-reward")
        return self._reward_pool


def _traceback_with_agent_line(exc: BaseException, agent_name: str) -> str:
    """The full traceback, then the deepest line of it in the agent's own file (where its author should look)."""
    text = "".join(traceback.format_exception(exc))
    try:
        agent_file = inspect.getsourcefile(get_agent_class(agent_name))
    except (KeyError, TypeError, ValueError):
        return text
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == agent_file]
    if frames:
        text += f"in agent {agent_name!r}: {frames[-1].filename}:{frames[-1].lineno}\n"
    return text


def check_output(output: AgentGraphOutput) -> None:
    """Raise ``ValueError`` when an output breaks the token invariants the trainer relies on."""
    check_sequence(output.prompt_ids, output.all_token_ids, output.loss_mask, output.response_logprobs)
    for index, sequence in enumerate(output.other_sequences):
        where = f"other_sequences[{index}]: "
        check_sequence(
            sequence.prompt_ids, sequence.all_token_ids, sequence.loss_mask, sequence.response_logprobs, where
        )
        if sequence.reward is not None and not math.isfinite(sequence.reward):
            raise ValueError(f"{where}reward must be a finite number, got {sequence.reward}")
    if output.turn_rewards is not None:
        check_turn_rewards(output.turn_rewards, output.loss_mask, len(output.prompt_ids))
    metrics = output.extra_fields.get(AGENT_METRICS_FIELD, {})
    if not isinstance(metrics, Mapping) or not all(
        isinstance(k, str) and isinstance(v, (int, float)) and math.isfinite(v) for k, v in metrics.items()
    ):
        raise ValueError(
            f"extra_fields[{AGENT_METRICS_FIELD!r}] must map metric names to finite numbers, got {metrics!r}"
        )


def check_turn_rewards(turn_rewards: Sequence[float], loss_mask: Sequence[int], prompt_length: int) -> None:
    """Raise ``ValueError`` unless there is one finite turn reward per model turn of the sequence."""
    turns = len(turn_spans(loss_mask, prompt_length))
    if len(turn_rewards) != turns:
        raise ValueError(
            f"turn_rewards has {len(turn_rewards)} entries for {turns} model turns (runs of generated tokens in "
            "loss_mask): give one per model turn, in order"
        )
    if not all(isinstance(r, (int, float)) and math.isfinite(r) for r in turn_rewards):
        raise ValueError(f"turn_rewards must be finite numbers, got {list(turn_rewards)}")


def check_sequence(
    prompt_ids: list[int],
    all_token_ids: list[int],
    loss_mask: list[int],
    response_logprobs: list[float] | None,
    where: str = "",
) -> None:
    """Raise ``ValueError`` (prefixed by ``where``) when one token sequence's lists do not line up."""
    n, p = len(all_token_ids), len(prompt_ids)
    if len(loss_mask) != n:
        raise ValueError(f"{where}loss_mask has {len(loss_mask)} entries for {n} tokens")
    if all_token_ids[:p] != prompt_ids or any(loss_mask[:p]):
        raise ValueError(f"{where}all_token_ids must start with prompt_ids, which carry loss_mask 0")
    if response_logprobs is not None and len(response_logprobs) != n - p:
        raise ValueError(f"{where}response_logprobs has {len(response_logprobs)} entries for {n - p} response tokens")


def _awaits_ranking(trajectory: Trajectory) -> bool:
    judged = trajectory.extra_fields.get(JUDGE_FIELD)
    return not trajectory.failed and isinstance(judged, dict) and judged.get("awaiting_ranking") is True


def _to_trajectory(
    output: AgentGraphOutput, group: int, sample: int, agent_name: str, reward: float, seconds: float
) -> Trajectory:
    extra = dict(output.extra_fields)
    turn_rewards = None if output.turn_rewards is None else [float(r) for r in output.turn_rewards]
    return Trajectory(
        group=group,
        sample=sample,
        agent_name=agent_name,
        prompt_ids=output.prompt_ids,
        all_token_ids=output.all_token_ids,
        loss_mask=output.loss_mask,
        response_logprobs=output.response_logprobs,
        reward=reward + sum(turn_rewards or ()),  # the outcome and every turn's own reward
        turn_rewards=turn_rewards,
        num_turns=output.num_turns,
        num_model_turns=int(extra.pop("num_model_turns", 0)),
        num_tool_calls=int(extra.pop("num_tool_calls", 0)),
        str_output=output.str_output,
        seconds=seconds,
        messages=extra.pop(MESSAGES_FIELD, None),
        multi_modal_inputs=output.multi_modal_inputs,
        other_sequences=list(output.other_sequences),
        extra_fields=extra,
    )


def summarize(trajectories: Sequence[Trajectory], seconds: float) -> RolloutStats:
    """Statistics over the successful trajectories; failures are counted with their reasons."""
    ok = [t for t in trajectories if not t.failed]
    failed = [t for t in trajectories if t.failed]
    rewards = [t.reward for t in ok]
    return RolloutStats(
        num_trajectories=len(trajectories),
        num_failed=len(failed),
        failure_reasons=Counter(t.failure_reason for t in failed),
        reward_mean=statistics.fmean(rewards) if rewards else 0.0,
        reward_std=statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        response_length_mean=statistics.fmean(t.num_generated_tokens for t in ok) if ok else 0.0,
        num_turns_mean=statistics.fmean(t.num_turns for t in ok) if ok else 0.0,
        tool_calls_mean=statistics.fmean(t.num_tool_calls for t in ok) if ok else 0.0,
        seconds=seconds,
        generated_tokens=sum(t.num_generated_tokens for t in ok),
        template_drift=sum(int(t.extra_fields.get("template_drift", 0)) for t in ok),
    )


def _since(start: float) -> float:
    return time.perf_counter() - start
