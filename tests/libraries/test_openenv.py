"""OpenEnv environments through lit-agentrl fit, in process and over their server: the environment OpenEnv ships
(``openenv init``'s echo environment, whose reward is 0.1 per character of the message), scored as it scores."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import fit_rows, free_port

if os.environ.get("LIT_AGENTRL_REQUIRE_OPENENV") != "1":  # CI sets it, after installing the extra
    pytest.importorskip("openenv", reason="OpenEnv's adapter tests need pip install 'lit-agentrl[openenv]'")

pytestmark = pytest.mark.slow
ENV = "echo_env"  # the package `openenv init echo_env` writes


@pytest.fixture(scope="module")
def echo_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """OpenEnv's own environment template, written by its CLI, importable as ``echo_env``."""
    root = tmp_path_factory.mktemp("openenv")
    subprocess.run([sys.executable, "-m", "openenv.cli", "init", ENV], cwd=root, check=True, capture_output=True)
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))


def agent_yaml(tmp_path: Path, **where: str) -> str:
    lines = [f"{key}: {value}" for key, value in where.items()]
    lines += [f"action: {ENV}.models:EchoAction", "action_field: message", "observation_field: echoed_message"]
    lines += ["max_turns: 3"]
    path = tmp_path / "openenv.yaml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def rows(cfg: str) -> list[dict]:
    prompt = "Say something; it is echoed back."
    return [{"agent_name": "openenv", "agent_cfg_path": cfg, "prompt": [{"role": "user", "content": f"{i}: {prompt}"}]}
            for i in range(3)]  # fmt: skip


def assert_scored_as_openenv_scores(records: list[dict]) -> None:
    from echo_env.models import EchoAction
    from echo_env.server.echo_env_environment import EchoEnvironment

    assert records and not any(r["failed"] for r in records)
    for record in records:
        actions = [m["content"] for m in record["messages"] if m["role"] == "assistant"]
        env = EchoEnvironment()
        env.reset()
        assert len(actions) == 3  # the echo environment never ends: the agent YAML's cap
        assert record["turn_rewards"] == [env.step(EchoAction(message=a)).reward for a in actions]
        users = [m["content"] for m in record["messages"] if m["role"] == "user"]
        assert users[1] == "Echo Env environment ready!"  # reset's observation follows the row's prompt
        assert users[2:] == actions[:2]  # then each step's: the echoed message


def test_an_environment_in_process_trains_scored_as_openenv_scores(tmp_path, tiny_model_dir, echo_env):
    cfg = agent_yaml(tmp_path, environment=f"{ENV}.server.echo_env_environment:EchoEnvironment")
    _, records = fit_rows(tmp_path / "run", tiny_model_dir, rows(cfg), max_new_tokens=4)
    assert_scored_as_openenv_scores(records)


def await_refusal(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """While another client holds the server's one session, a trajectory's reset waits, then fails naming the fix."""
    import asyncio

    from echo_env.client import EchoEnv

    from lit_agentrl.agents.libraries import openenv

    monkeypatch.setattr(openenv, "SESSION_WAIT_S", 1.0)

    async def refused() -> str:
        async with EchoEnv(base_url=url) as holder:
            await holder.reset()
            with pytest.raises(RuntimeError) as caught:
                await openenv._session(EchoEnv, url, {})
            return str(caught.value)

    message = asyncio.run(refused())
    assert f"the OpenEnv server at {url} gave no session within 1 s" in message and "set max_sessions" in message


def test_an_environment_over_its_server_trains_scored_as_openenv_scores(
    tmp_path, tiny_model_dir, echo_env, monkeypatch
):
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", f"{ENV}.server.app:app", "--port", str(port), "--log-level", "warning"],
        cwd=echo_env,
    )
    try:
        from lit_agentrl.engines.sglang_group import wait_until_healthy

        wait_until_healthy(f"http://127.0.0.1:{port}", server, timeout_s=60)
        url = f"http://127.0.0.1:{port}"
        cfg = agent_yaml(tmp_path, client=f"{ENV}.client:EchoEnv", base_url=url, max_sessions="1")  # as it serves
        _, records = fit_rows(tmp_path / "run", tiny_model_dir, rows(cfg), max_new_tokens=4)
        await_refusal(url, monkeypatch)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert_scored_as_openenv_scores(records)


def test_an_agent_yaml_without_its_keys_fails_naming_them(tmp_path, tiny_model_dir, echo_env):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(f"action: {ENV}.models:EchoAction\naction_field: message\n")
    with pytest.raises(RuntimeError, match=r"its agent YAML needs 'client'"):
        fit_rows(tmp_path / "run", tiny_model_dir, rows(str(cfg)), max_new_tokens=4)
