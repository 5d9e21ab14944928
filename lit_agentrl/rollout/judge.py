"""The LLM judge: the ``judge`` reward asks a judge model to score each trajectory by a rubric.

Two modes (``reward.judge.mode``): ``score`` asks about each trajectory alone; ``rank`` (RULER's idea: GRPO needs only
how a group's trajectories compare) asks once per prompt group, after the whole group is generated, for a score of
each response relative to the others.

The judge is any OpenAI-compatible endpoint (``reward.judge.base_url``: a vLLM or SGLang server, a hosted API) or a
judge model served in this process by a registered engine (``reward.judge.model_path``). A trajectory's call is made
from the rollout's event loop once its generation is done, so judging overlaps the generation of the others, at most
``max_concurrency`` calls at a time. The judge sees the rubric (system), then the task (the row's prompt), the
reference answer when the row has a ground truth, and the response (the trajectory's generated text); its reply must
end with ``SCORE: <number in [0, 1]>`` (``rank``: a line ``SCORE <k>: <number>`` per response). A call that fails, times out or answers without a score fails the
trajectory with a :class:`JudgeError` naming the judge and what it said (counted in ``rollout/failed`` and the step's
failure report, never a silent zero). The judge's messages, reply and score are kept in the trajectory's
``extra["judge"]`` (the trajectory log and the viewer show them).
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import os
import re
import weakref
from typing import Any, Protocol

from langchain_core.messages import convert_to_openai_messages

from lit_agentrl.agents.chat_model import ChatModel
from lit_agentrl.config.rollout import Judge
from lit_agentrl.engines import SamplingParams
from lit_agentrl.engines.registry import build_engines
from lit_agentrl.models.processors import load_tokenizer
from lit_agentrl.rewards.registry import register_reward
from lit_agentrl.rows import row_ground_truth

__all__ = [
    "JUDGE_FIELD",
    "JudgeError",
    "LLMJudge",
    "judge_messages",
    "parse_ranked_scores",
    "parse_score",
    "ranking_messages",
]

JUDGE_FIELD = "judge"  # the trajectory's extra field holding the judge's messages, reply and score
_NUMBER = r"([-+]?\d*\.?\d+(?:[eE][-+]?\d+)?)"
_SCORE = re.compile(rf"SCORE:\s*{_NUMBER}", re.IGNORECASE)
_RANKED = re.compile(rf"SCORE\s+(\d+)\s*:\s*{_NUMBER}", re.IGNORECASE)


class JudgeError(RuntimeError):
    """A judge call that gave no usable score: the trajectory fails, named."""


class _Backend(Protocol):
    where: str

    async def reply(self, messages: list[dict[str, str]]) -> str: ...

    def close(self) -> None: ...


class _Endpoint:
    """An OpenAI-compatible endpoint, through the official client."""

    def __init__(self, settings: Judge) -> None:
        import openai

        self.where = f"{settings.base_url} ({settings.model})"
        self.model, self.max_tokens = settings.model, settings.max_tokens
        key = os.environ.get(settings.api_key_env) or "EMPTY"
        self.client = openai.AsyncOpenAI(base_url=settings.base_url, api_key=key, max_retries=0)

    async def reply(self, messages: list[dict[str, str]]) -> str:
        response = await self.client.chat.completions.create(
            model=str(self.model),
            messages=messages,  # type: ignore[arg-type]
            max_tokens=self.max_tokens,
            temperature=0.0,
        )
        return response.choices[0].message.content or ""

    def close(self) -> None:
        """The client's connections close with the event loop that opened them."""


class _LocalEngine:
    """A judge model served by the engines a registered engine builds (``sglang_http``: one per server URL), taken in
    turn, greedy."""

    def __init__(self, settings: Judge, seed: int) -> None:
        path = str(settings.model_path)
        self.where = f"the {settings.engine} engine over {path}"
        self.engines = build_engines(settings.engine, path, seed=seed, **settings.engine_kwargs)
        tokenizer = load_tokenizer(path)
        self.chats = itertools.cycle([ChatModel(model="judge", llm=e, tokenizer=tokenizer) for e in self.engines])
        self.sampling = SamplingParams.of({"max_new_tokens": settings.max_tokens, "temperature": 0.0})

    async def reply(self, messages: list[dict[str, str]]) -> str:
        return str((await next(self.chats).ainvoke(messages, sampling_params=self.sampling)).content)

    def close(self) -> None:
        for engine in self.engines:
            engine.shutdown()


class LLMJudge:
    """Scores trajectories with the judge of ``settings`` (see the module's docstring)."""

    def __init__(self, settings: Judge, seed: int = 0) -> None:
        self.settings = settings
        self.backend: _Backend = _Endpoint(settings) if settings.base_url else _LocalEngine(settings, seed)
        # Calls in flight, per event loop (the manager's, or the background one of asynchronous rollouts).
        self._slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )

    @property
    def ranks(self) -> bool:
        """Whether the judge scores a prompt group's trajectories together (``mode: rank``)."""
        return self.settings.mode == "rank"

    async def score(self, row: dict[str, Any], response: str) -> tuple[float, dict[str, Any]]:
        """The judge's score of ``response`` to ``row``'s task, and the record kept with the trajectory."""
        messages = judge_messages(self.settings.instructions, row, response)
        reply = await self._ask(messages)
        score = parse_score(reply, self.backend.where)
        return score, {"messages": messages, "reply": reply, "score": score}

    async def rank(self, row: dict[str, Any], responses: list[str]) -> tuple[list[float], dict[str, Any]]:
        """The judge's scores of a group's ``responses`` compared with each other, and the group's record."""
        messages = ranking_messages(self.settings.instructions, row, responses)
        reply = await self._ask(messages)
        scores = parse_ranked_scores(reply, len(responses), self.backend.where)
        return scores, {"messages": messages, "reply": reply, "scores": scores}

    async def _ask(self, messages: list[dict[str, str]]) -> str:
        loop = asyncio.get_running_loop()
        slots = self._slots.setdefault(loop, asyncio.Semaphore(self.settings.max_concurrency))
        async with slots:
            # Outside the trajectory's context: the judge samples by its own parameters, not the policy's.
            call = loop.create_task(self.backend.reply(messages), context=contextvars.Context())
            try:
                return await asyncio.wait_for(call, self.settings.timeout_s)
            except TimeoutError:
                raise JudgeError(
                    f"the judge ({self.backend.where}) gave no reply within {self.settings.timeout_s} s"
                ) from None
            except Exception as exc:
                raise JudgeError(f"the judge ({self.backend.where}) failed: {type(exc).__name__}: {exc}") from exc

    def close(self) -> None:
        self.backend.close()


def judge_messages(rubric: str, row: dict[str, Any], response: str) -> list[dict[str, str]]:
    """What the judge is asked: the rubric, then the task, the reference answer (if any) and the response."""
    parts = [*_task(row), f"# Response\n{response}"]
    return [{"role": "system", "content": rubric}, {"role": "user", "content": "\n\n".join(parts)}]


def ranking_messages(rubric: str, row: dict[str, Any], responses: list[str]) -> list[dict[str, str]]:
    """What a ranking judge is asked: the rubric, the task, the reference answer (if any) and the numbered responses."""
    parts = [*_task(row), *(f"# Response {k}\n{response}" for k, response in enumerate(responses, 1))]
    return [{"role": "system", "content": rubric}, {"role": "user", "content": "\n\n".join(parts)}]


def _task(row: dict[str, Any]) -> list[str]:
    prompt = convert_to_openai_messages(list(row.get("prompt") or row.get("messages") or []))
    parts = ["# Task\n" + "\n".join(f"{m['role']}: {_text(m.get('content'))}" for m in prompt)]
    truth = row_ground_truth(row)
    if truth not in (None, ""):
        parts.append(f"# Reference answer\n{truth}")
    return parts


def parse_score(reply: str, where: str) -> float:
    """The number after the reply's last ``SCORE:``, in [0, 1]; :class:`JudgeError` quoting the reply otherwise."""
    found = _SCORE.findall(reply)
    if not found:
        raise JudgeError(f"the judge ({where}) replied without 'SCORE: <0..1>': {reply[-300:]!r}")
    score = float(found[-1])
    if not 0.0 <= score <= 1.0:
        raise JudgeError(f"the judge ({where}) scored {score}, outside [0, 1]: {reply[-300:]!r}")
    return score


def parse_ranked_scores(reply: str, count: int, where: str) -> list[float]:
    """``SCORE <k>: <x>`` for each response ``k`` in 1..count (a later line for the same ``k`` wins), each in [0, 1];
    :class:`JudgeError` quoting the reply when one is missing or out of range."""
    scores = {int(k): float(x) for k, x in _RANKED.findall(reply)}
    missing = [k for k in range(1, count + 1) if k not in scores]
    if missing:
        raise JudgeError(f"the judge ({where}) gave no 'SCORE <k>: <0..1>' for responses {missing}: {reply[-300:]!r}")
    ranked = [scores[k] for k in range(1, count + 1)]
    if not all(0.0 <= x <= 1.0 for x in ranked):
        raise JudgeError(f"the judge ({where}) scored outside [0, 1]: {reply[-300:]!r}")
    return ranked


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return " ".join(str(part.get("text")) for part in content or [] if isinstance(part, dict) and part.get("text"))


@register_reward("judge")
def judge_reward(completion: str, ground_truth: Any, **row: Any) -> float:
    """The name rows and ``reward.fn`` choose the judge by; the rollout manager asks its :class:`LLMJudge` instead."""
    raise JudgeError("the 'judge' reward needs RolloutCallback.reward.judge (an endpoint or a local judge model)")


judge_reward.needs_ground_truth = False  # type: ignore[attr-defined]
