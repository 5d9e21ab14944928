"""The trajectory log's format: one JSON object per trajectory, one line each, in ``trajectories/rank{R}.jsonl``.

Every field is documented in docs/viewer.md; :data:`FORMAT_VERSION` changes when a
field changes meaning.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lit_agentrl.display import inert, inert_values, json_inert
from lit_agentrl.rows import row_ground_truth, row_prompt
from lit_agentrl.types import TokenSequence, Trajectory

FORMAT_VERSION = 1
RECORD_KEY = ("split", "step", "rank", "batch", "group", "sample")
"""Fields that identify a trajectory in a run; a resumed run may log a step twice, the last line wins."""
TABLE_COLUMNS = [
    "step",
    "agent",
    "data_source",
    "prompt",
    "output",
    "reward",
    "advantage",
    "failed",
    "failure_reason",
    "generated_tokens",
]
"""Columns of the samples table sent to the logger (``rollout/samples`` under wandb)."""


def trajectory_record(
    t: Trajectory, row: Mapping[str, Any] | None, *, step: int, split: str, rank: int, batch: int, tokens: bool
) -> dict[str, Any]:
    """The log line of one trajectory (without ``tokens``: the writer decodes them off the training thread)."""
    row = row or {}
    prompt_tokens = len(t.prompt_ids)
    record: dict[str, Any] = {
        "v": FORMAT_VERSION,
        "step": step,
        "split": split,
        "rank": rank,
        "batch": batch,
        "group": t.group,
        "sample": t.sample,
        "agent_name": t.agent_name,
        "data_source": row.get("data_source"),
        "prompt": _prompt(row),
        "ground_truth": row_ground_truth(row),
        "messages": t.messages,
        "str_output": t.str_output,
        "reward": t.reward,
        "advantage": t.advantage,
        "turn_rewards": t.turn_rewards,
        "turn_advantages": t.turn_advantages,
        "failed": t.failed,
        "failure_reason": t.failure_reason,
        "failure_traceback": t.failure_traceback,
        "prompt_tokens": prompt_tokens,
        "generated_tokens": t.num_generated_tokens,
        "total_tokens": len(t.all_token_ids),
        "num_turns": t.num_turns,
        "num_model_turns": t.num_model_turns,
        "num_tool_calls": t.num_tool_calls,
        "truncated": t.truncated,
        "seconds": round(t.seconds, 3),
        "extra": {k: v for k, v in t.extra_fields.items() if k != "messages"},
        "other_sequences": [_sequence_record(s, tokens) for s in t.other_sequences],
    }
    if tokens:
        record["token_ids"] = list(t.all_token_ids)
        record["loss_mask"] = list(t.loss_mask)
        record["logprobs"] = aligned_logprobs(t.main_sequence)
    return record


def _sequence_record(sequence: TokenSequence, tokens: bool) -> dict[str, Any]:
    record: dict[str, Any] = {
        "prompt_tokens": len(sequence.prompt_ids),
        "generated_tokens": sequence.num_generated_tokens,
        "total_tokens": len(sequence.all_token_ids),
        "reward": sequence.reward,
    }
    if tokens:
        record["token_ids"] = list(sequence.all_token_ids)
        record["loss_mask"] = list(sequence.loss_mask)
        record["logprobs"] = aligned_logprobs(sequence)
    return record


def _prompt(row: Mapping[str, Any]) -> Any:
    try:
        return row_prompt(row)
    except KeyError:
        return None


def aligned_logprobs(t: TokenSequence) -> list[float | None]:
    """``response_logprobs`` aligned with ``all_token_ids`` (rounded): None on the prompt and on tokens not generated."""
    prompt, logprobs = len(t.prompt_ids), t.response_logprobs
    if logprobs is None:
        return [None] * len(t.all_token_ids)
    response = [round(lp, 4) if mask else None for lp, mask in zip(logprobs, t.loss_mask[prompt:])]
    return [None] * prompt + response + [None] * (len(t.all_token_ids) - prompt - len(response))


def prompt_text(prompt: Any) -> str:
    """A chat prompt as ``role: content`` lines (anything else as its JSON)."""
    if isinstance(prompt, Sequence) and not isinstance(prompt, str):
        return "\n".join(f"{m.get('role')}: {m.get('content')}" if isinstance(m, Mapping) else str(m) for m in prompt)
    return prompt if isinstance(prompt, str) else json.dumps(prompt, default=str)


def table_row(record: Mapping[str, Any]) -> list[Any]:
    """The record as a row of :data:`TABLE_COLUMNS`, its text made inert (a logger's page shows it)."""
    row = [
        record["step"],
        record["agent_name"],
        record["data_source"],
        prompt_text(record["prompt"]),
        record["str_output"],
        record["reward"],
        record["advantage"],
        record["failed"],
        record["failure_reason"],
        record["generated_tokens"],
    ]
    return [inert_values(value) for value in row]


def to_json_line(record: Mapping[str, Any], pieces: Callable[[list[int]], list[str]] | None) -> str:
    """One line of the log; ``pieces`` decodes ``token_ids`` into per-token strings (``tokens``)."""
    if pieces is not None and "token_ids" in record:
        record = {**record, "tokens": pieces(record["token_ids"])}
    return json_inert(json.dumps(record, ensure_ascii=False, default=_jsonable, allow_nan=True)) + "\n"


def _jsonable(value: Any) -> Any:
    """Rows may hold numpy arrays or other objects: lists where they convert, else their text."""
    tolist = getattr(value, "tolist", None)
    return tolist() if callable(tolist) else str(value)


class TokenPieces:
    """Each token id as the text it decodes to alone, decoded once per id (a step decodes thousands of tokens)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.cache: dict[int, str] = {}

    def __call__(self, ids: list[int]) -> list[str]:
        missing = sorted({i for i in ids if i not in self.cache})
        if missing:
            self.cache.update(zip(missing, self.tokenizer.batch_decode([[i] for i in missing])))
        return [self.cache[i] for i in ids]


def samples_text(records: Sequence[Mapping[str, Any]]) -> str:
    """A human-readable page of one step's samples (the CSV logger's ``samples/step_NNNNNN.txt``), its text made
    inert: people read it in terminals."""
    parts = []
    for r in records:
        status = f"FAILED: {r['failure_reason']}" if r["failed"] else f"reward {r['reward']:.4g}"
        advantage = "-" if r["advantage"] is None else f"{r['advantage']:.4g}"
        parts.append(
            f"=== step {r['step']} {r['split']} rank {r['rank']} group {r['group']} sample {r['sample']} | "
            f"{r['agent_name']} | {status} | advantage {advantage} | {r['generated_tokens']} tokens, "
            f"{r['num_turns']} turns\n--- prompt\n{prompt_text(r['prompt'])}\n--- output\n{r['str_output']}\n"
            + (f"--- traceback\n{r['failure_traceback']}\n" if r["failure_traceback"] else "")
        )
    return inert("\n".join(parts))
