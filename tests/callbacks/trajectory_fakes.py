"""Real Trajectory and PromptBatch objects over the tiny tokenizer, and a stand-in trainer, for TrajectoryLog's tests
(tests/viewer imports this module too, to build pages from logs the real callback wrote)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from lit_agentrl.callbacks import TrajectoryLog
from lit_agentrl.types import PromptBatch, RolloutBatch, RolloutStats, Trajectory

INJECTION = "<script>window.__pwned = 1</script><img src=x onerror=alert(1)>"
"""An output that must show as text in the viewer, never run."""


class FakeTrainer:
    """What TrajectoryLog reads of a Trainer: rank, loggers, the logged step, a broadcast from rank 0's folder."""

    def __init__(self, root: Path, loggers: list[Any] | None = None, rank: int = 0, step: int = 0) -> None:
        self.global_rank, self.is_global_zero = rank, rank == 0
        self.loggers = loggers or []
        self.default_root_dir = str(root)
        self.sanity_checking = False
        self.strategy = SimpleNamespace(broadcast=lambda obj, src=0: str(root) if obj is None else obj)
        self.fit_loop = SimpleNamespace(epoch_loop=SimpleNamespace(_batches_that_stepped=step))

    @property
    def step(self) -> int:
        return self.fit_loop.epoch_loop._batches_that_stepped

    @step.setter
    def step(self, value: int) -> None:
        self.fit_loop.epoch_loop._batches_that_stepped = value


def make_trajectory(
    tokenizer: Any, group: int, sample: int, output: str, reward: float, agent: str = "single_turn", **kwargs: Any
) -> Trajectory:
    """A finished single-turn trajectory: the prompt, ``output`` generated (loss mask 1), made-up log-probs."""
    prompt = f"What is {group} + {sample}?"
    prompt_ids = tokenizer.encode(prompt)
    out_ids = tokenizer.encode(output)
    return Trajectory(
        group=group,
        sample=sample,
        agent_name=agent,
        prompt_ids=prompt_ids,
        all_token_ids=prompt_ids + out_ids,
        loss_mask=[0] * len(prompt_ids) + [1] * len(out_ids),
        response_logprobs=[-0.5 * (i % 4) for i in range(len(out_ids))],
        reward=reward,
        num_turns=2,
        num_model_turns=1,
        str_output=output,
        seconds=0.25,
        messages=[{"role": "user", "content": prompt}, {"role": "assistant", "content": output}],
        **kwargs,
    )


def tool_trajectory(tokenizer: Any, group: int, sample: int, reward: float) -> Trajectory:
    """Two model turns around a tool call; the tool's output sits in the tokens with loss mask 0."""
    parts = [("What is 6 * 7?", 0), ('<tool_call>{"name": "calc"}</tool_call>', 1), ("42", 0), ("The answer is 42", 1)]
    ids, mask = [], []
    for text, m in parts:
        piece = tokenizer.encode(text)
        ids += piece
        mask += [m] * len(piece)
    prompt = len(tokenizer.encode(parts[0][0]))
    call = {"id": "call_0", "type": "function", "function": {"name": "calc", "arguments": '{"expr": "6*7"}'}}
    return Trajectory(
        group=group,
        sample=sample,
        agent_name="mathcode_agent",
        prompt_ids=ids[:prompt],
        all_token_ids=ids,
        loss_mask=mask,
        response_logprobs=[-0.2 if m else 0.0 for m in mask[prompt:]],
        reward=reward,
        num_turns=4,
        num_model_turns=2,
        num_tool_calls=1,
        str_output="The answer is 42",
        messages=[
            {"role": "system", "content": "You can call calc."},
            {"role": "user", "content": "What is 6 * 7?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": "42", "tool_call_id": "call_0"},
            {"role": "assistant", "content": "The answer is 42"},
        ],
        extra_fields={"finish_reason": {"type": "stop"}, "metrics": {"solved": 1.0}},
    )


def failed_trajectory(group: int, sample: int, agent: str = "single_turn") -> Trajectory:
    return Trajectory(
        group=group,
        sample=sample,
        agent_name=agent,
        failed=True,
        failure_reason="ValueError: the agent broke",
        failure_traceback='Traceback (most recent call last):\n  File "agent.py", line 3\nValueError: the agent broke',
    )


def step_batch(tokenizer: Any, step: int, groups: int = 4, n: int = 4, split: str = "train") -> PromptBatch:
    """A step of ``groups`` x ``n`` trajectories: group 1 holds a failure, group 2 a tool-calling agent, group 3 the
    HTML-injection output; advantages set as the training step sets them."""
    trajectories: list[Trajectory] = []
    for g in range(groups):
        for s in range(n):
            reward = float((s + step) % 2)
            if g == 1 and s == 0:
                trajectories.append(failed_trajectory(g, s))
            elif g == 2:
                trajectories.append(tool_trajectory(tokenizer, g, s, reward))
            else:
                output = INJECTION if g == 3 and s == 0 else f"the answer is {g + s}"
                trajectories.append(make_trajectory(tokenizer, g, s, output, reward))
    if split == "train":
        for t in trajectories:
            t.advantage = None if t.failed else t.reward - 0.5
    rows = [
        {
            "data_source": "arith" if g % 2 else "tools",
            "agent_name": "mathcode_agent" if g == 2 else "single_turn",
            "prompt": [{"role": "user", "content": f"What is {g} + ?"}],
            "reward_model": {"style": "rule", "ground_truth": str(g)},
        }
        for g in range(groups)
    ]
    rollout = RolloutBatch(trajectories, RolloutStats(num_trajectories=len(trajectories)), temperature=1.0)
    return PromptBatch(rows=rows, epoch=0, index=step, split=split, rollout=rollout)


def write_log(
    callback: TrajectoryLog, trainer: FakeTrainer, model_dir: Path, tokenizer: Any, steps: int, val: bool = False
) -> None:
    """Drive the callback through ``steps`` training steps (and a validation run after them) like a fit would."""
    module = SimpleNamespace(model_path=str(model_dir))
    callback.setup(trainer, module, "fit")  # type: ignore[arg-type]
    for step in range(steps):
        trainer.step = step
        callback.on_train_batch_end(trainer, module, None, step_batch(tokenizer, step), step)  # type: ignore[arg-type]
    if val:
        callback.on_validation_epoch_start(trainer, module)  # type: ignore[arg-type]
        for i in range(2):
            callback.on_validation_batch_end(trainer, module, None, step_batch(tokenizer, i, split="val"), i)  # type: ignore[arg-type]
    callback.teardown(trainer, module, "fit")  # type: ignore[arg-type]
