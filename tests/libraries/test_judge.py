"""LLM-judge rewards: a judge model served by a local engine or behind an OpenAI-compatible endpoint scores each
trajectory; its failures fail the trajectory, named and counted."""

from __future__ import annotations

import asyncio
import random
import socket
import string
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from support import fit_rows, free_port
from transformers import AutoModelForCausalLM, AutoTokenizer

from lit_agentrl.config.rollout import DEFAULT_JUDGE_RUBRIC, DEFAULT_RANKING_RUBRIC, Judge, Rewards
from lit_agentrl.errors import UserInputError
from lit_agentrl.rollout.judge import (
    JudgeError,
    LLMJudge,
    judge_messages,
    parse_ranked_scores,
    parse_score,
    ranking_messages,
)
from lit_agentrl.rollout.manager import RolloutManager

pytestmark = pytest.mark.slow
VERDICT = "SCORE: 1"
RANKING = "SCORE 1: 1\nSCORE 2: 0.25"


def rows(count: int) -> list[dict]:
    return [
        {"agent_name": "single_turn", "prompt": [{"role": "user", "content": f"Say something about {i}."}]}
        for i in range(count)
    ]


def taught_judge(tiny_model_dir: Path, out: Path, verdict: str, prompts: list[list[dict]], steps: int = 60) -> Path:
    """The tiny model taught in a few seconds of supervised training to answer the judge's prompts with ``verdict``: a
    real model and engine standing for a judge model (a random one never writes a score)."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    target = [*tokenizer.encode(verdict, add_special_tokens=False), tokenizer.eos_token_id]
    ids = [chat_ids(tokenizer, messages) for messages in prompts]
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(steps):
        loss = torch.stack([_reply_loss(model, prompt, target) for prompt in ids]).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


RESPONSES = ["yes", "12", "a b c", ""]


@pytest.fixture(scope="module")
def judge_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    prompts = [judge_messages(DEFAULT_JUDGE_RUBRIC, row, answer) for row, answer in zip(rows(4), RESPONSES)]
    return taught_judge(tiny_model_dir, tmp_path_factory.mktemp("judge"), VERDICT, prompts)


@pytest.fixture(scope="module")
def ranking_judge_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wider, deeper tiny model (the test model's two 64-wide layers loop on the repeated lines of a ranking)."""
    from lit_agentrl.models.tiny import TinyModelConfig, save_tiny_model

    shape = {"hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4}
    base = save_tiny_model(tmp_path_factory.mktemp("ranking-base"), TinyModelConfig(**shape, num_key_value_heads=4))
    noise = random.Random(0)  # responses like the random policy's: a few arbitrary characters
    texts = ["".join(noise.choice(string.printable[:94]) for _ in range(noise.randint(0, 8))) for _ in range(16)]
    prompts = [ranking_messages(DEFAULT_RANKING_RUBRIC, rows(8)[k], texts[2 * k : 2 * k + 2]) for k in range(8)]
    return taught_judge(base, tmp_path_factory.mktemp("ranking-judge"), RANKING, prompts, steps=120)


def chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def _reply_loss(model: torch.nn.Module, prompt: list[int], target: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + target])
    logits = model(ids).logits[0, len(prompt) - 1 : -1]
    return torch.nn.functional.cross_entropy(logits, torch.tensor(target))


class OpenAIStyleServer:
    """A local OpenAI-compatible ``/v1/chat/completions`` over a transformers model (greedy), as vLLM or SGLang
    would serve it; ``mode`` makes it misbehave: ``no_score`` (a reply without a score), ``hang`` (never answers)."""

    def __init__(self, model_dir: Path, mode: str = "ok") -> None:
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        self.mode, self.keys, self.port = mode, [], free_port()

        async def completions(request):
            body = await request.json()
            self.keys.append(request.headers.get("authorization"))
            if self.mode == "hang":
                await asyncio.sleep(3600)
            text = "I like it." if self.mode == "no_score" else self.reply(body["messages"], body["max_tokens"])
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            return JSONResponse(
                {"id": "c", "object": "chat.completion", "created": 0, "model": body["model"], "choices": [choice]}
            )

        self.app = Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])

    def reply(self, messages: list[dict], max_tokens: int) -> str:
        ids = torch.tensor([chat_ids(self.tokenizer, messages)])
        with torch.no_grad():
            out = self.model.generate(ids, max_new_tokens=max_tokens, do_sample=False)
        return self.tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)

    def __enter__(self) -> str:
        import uvicorn

        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            threading.Event().wait(0.01)
        return f"http://127.0.0.1:{self.port}/v1"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def test_the_score_is_the_replys_last_and_must_lie_in_zero_to_one():
    assert parse_score("Fine.\nSCORE: 0.25\nSCORE: 0.75", "j") == 0.75
    with pytest.raises(JudgeError, match="without 'SCORE"):
        parse_score("Looks right to me.", "j")
    with pytest.raises(JudgeError, match="outside"):
        parse_score("SCORE: 7", "j")


def test_a_ranking_reply_scores_every_response_in_order():
    assert parse_ranked_scores("A is better.\nSCORE 2: 0.5\nSCORE 1: 0.9", 2, "j") == [0.9, 0.5]
    with pytest.raises(JudgeError, match=r"for responses \[3\]"):
        parse_ranked_scores("SCORE 1: 1\nSCORE 2: 0", 3, "j")
    with pytest.raises(JudgeError, match="outside"):
        parse_ranked_scores("SCORE 1: 1\nSCORE 2: 2", 2, "j")
    _, user = ranking_messages("Rank.", {"prompt": [{"role": "user", "content": "Hi"}]}, ["a", "b"])
    assert user["content"] == "# Task\nuser: Hi\n\n# Response 1\na\n\n# Response 2\nb"


def test_the_judge_sees_the_rubric_the_task_the_reference_and_the_response():
    row = {"prompt": [{"role": "user", "content": "2+2?"}], "reward_model": {"ground_truth": "4"}}
    system, user = judge_messages("Grade it.", row, "It is 4.")
    assert system == {"role": "system", "content": "Grade it."}
    assert user["content"] == "# Task\nuser: 2+2?\n\n# Reference answer\n4\n\n# Response\nIt is 4."
    assert "Reference" not in judge_messages("Grade it.", {"prompt": row["prompt"]}, "4")[1]["content"]


def test_the_judge_settings_are_checked_when_read():
    with pytest.raises(UserInputError, match="go together"):
        Rewards(fn="judge")
    with pytest.raises(UserInputError, match="go together"):
        Rewards(fn="math", judge=Judge(model_path="/m"))
    with pytest.raises(UserInputError, match="exactly one of base_url"):
        Judge(base_url="http://x/v1", model="m", model_path="/m")
    with pytest.raises(UserInputError, match="name the model"):
        Judge(base_url="http://x/v1")


def test_a_fit_rewarded_by_a_local_judge_engine(tmp_path, tiny_model_dir, judge_model_dir):
    judge = {"model_path": str(judge_model_dir), "max_tokens": 8}
    _, records = fit_rows(tmp_path, tiny_model_dir, rows(4), rollout={"reward": {"fn": "judge", "judge": judge}})
    assert records and not any(r["failed"] for r in records)
    for record in records:
        verdict = record["extra"]["judge"]
        assert verdict["reply"] == VERDICT and verdict["score"] == record["reward"] == 1.0
        assert verdict["messages"][1]["content"].endswith(f"# Response\n{record['str_output']}")


def test_a_fit_rewarded_by_an_openai_compatible_endpoint(tmp_path, tiny_model_dir, judge_model_dir, monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", "sk-local")
    with OpenAIStyleServer(judge_model_dir) as url:
        judge = {"base_url": url, "model": "judge", "api_key_env": "JUDGE_KEY", "max_tokens": 8}
        _, records = fit_rows(tmp_path, tiny_model_dir, rows(4), rollout={"reward": {"fn": "judge", "judge": judge}})
    assert records and all(r["extra"]["judge"]["reply"] == VERDICT and r["reward"] == 1.0 for r in records)


def test_a_fit_rewarded_by_a_ranking_judge_scores_each_group_in_one_call(tmp_path, tiny_model_dir, ranking_judge_dir):
    judge = {"model_path": str(ranking_judge_dir), "max_tokens": 48, "mode": "rank"}
    _, records = fit_rows(tmp_path, tiny_model_dir, rows(3), rollout={"reward": {"fn": "judge", "judge": judge}})
    train = [r for r in records if r["split"] == "train"]
    assert train and not any(r["failed"] for r in records)
    for record in train:  # two samples per prompt: the judge's first response gets 1, its second 0.25
        verdict = record["extra"]["judge"]
        assert verdict["reply"] == RANKING and verdict["scores"] == [1.0, 0.25]
        assert record["reward"] == verdict["score"] == verdict["scores"][verdict["response"] - 1]
        assert verdict["messages"][1]["content"].count("# Response ") == 2
    assert sorted(r["reward"] for r in train if r["step"] == train[0]["step"]) == [0.25] * 3 + [1.0] * 3


@pytest.fixture()
def closed_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]  # bound, not listening: connections are refused


@pytest.mark.parametrize("fault", ["refused", "no_score", "hang"])
def test_judge_faults_fail_their_trajectories_named(fault, engine, tokenizer, judge_model_dir, closed_port):
    server = OpenAIStyleServer(judge_model_dir, mode=fault)
    with server as url:
        url = f"http://127.0.0.1:{closed_port}/v1" if fault == "refused" else url
        judge = LLMJudge(Judge(base_url=url, model="judge", timeout_s=1.0))
        manager = RolloutManager([engine], tokenizer, reward_fn="judge", judge=judge)
        try:
            batch = manager.generate(rows(2), n_samples=2, sampling_params={"max_new_tokens": 2, "temperature": 1.0})
        finally:
            manager.close()
    expected = {"refused": "failed: APIConnectionError", "no_score": "without 'SCORE", "hang": "no reply within 1.0 s"}
    assert len(batch.trajectories) == 4 and batch.stats.num_failed == 4
    for trajectory in batch.trajectories:
        assert trajectory.failure_reason.startswith(f"JudgeError: the judge ({url} (judge))")
        assert expected[fault] in trajectory.failure_reason


def test_a_local_judge_takes_the_engines_it_builds_in_turn_and_shuts_each_down(judge_model_dir):
    """An engine config that builds several engines (``sglang_http`` with several servers) gives the judge each."""
    from lit_agentrl.engines import register_engine
    from lit_agentrl.engines.hf import TransformersEngine

    calls, shut = [0, 0], [0, 0]

    def counted(engine: TransformersEngine, index: int) -> TransformersEngine:
        generate, shutdown = engine.async_generate, engine.shutdown

        async def async_generate(*args, **kwargs):
            calls[index] += 1
            return await generate(*args, **kwargs)

        def stop() -> None:
            shut[index] += 1
            shutdown()

        engine.async_generate, engine.shutdown = async_generate, stop
        return engine

    @register_engine("judge_pair_test")
    class EnginePair(TransformersEngine):
        @classmethod
        def build(cls, model_path, seed=0, placement=None, **kwargs):
            return [counted(TransformersEngine(model_path, seed=seed), index) for index in range(2)]

    judge = LLMJudge(Judge(model_path=str(judge_model_dir), engine="judge_pair_test", max_tokens=8))
    try:

        async def four() -> list[float]:
            return [(await judge.score(row, "yes"))[0] for row in rows(4)]

        assert asyncio.run(four()) == [1.0] * 4
    finally:
        judge.close()
    assert calls == [2, 2] and shut == [1, 1]
