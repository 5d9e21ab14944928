"""A single-turn verifiers taskset over a local JSONL file, built from verifiers' own constructors (``vf.Taskset``,
``vf.Task``, ``@vf.reward``) as its docs define one: each line ``{"question": ..., "answer": ...}``, the reply scored
1 when its last ``<answer>...</answer>`` (else the whole reply) equals the answer.

It runs in verifiers' venv (``scripts/build_verifiers_env.sh``), named in a row's taskset as
``{id: configs/verifiers/answer_taskset.py:AnswerTaskset, path: <the JSONL file>}``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import verifiers.v1 as vf

SYSTEM_PROMPT = "Answer with the answer alone, inside <answer></answer>."


class AnswerData(vf.TaskData):
    answer: str = ""


class AnswerTask(vf.Task[AnswerData]):
    @vf.reward(weight=1.0)
    async def exact_answer(self, trace: vf.Trace) -> float:
        found = re.findall(r"<answer>(.*?)</answer>", trace.last_reply, flags=re.DOTALL)
        given = found[-1] if found else trace.last_reply
        return float(given.strip().lower() == self.data.answer.strip().lower())


class AnswerTasksetConfig(vf.TasksetConfig):
    path: str = ""
    """The JSONL file of questions and answers."""


class AnswerTaskset(vf.Taskset[AnswerTask, AnswerTasksetConfig]):
    def load(self) -> list[AnswerTask]:
        lines = Path(self.config.path).read_text().splitlines()
        rows = [json.loads(line) for line in lines if line.strip()]
        return [
            AnswerTask(
                AnswerData(prompt=r["question"], answer=str(r["answer"]), system_prompt=SYSTEM_PROMPT), self.config.task
            )
            for r in rows
        ]
