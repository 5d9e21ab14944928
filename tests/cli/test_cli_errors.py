"""A configuration or data error (UserInputError) is one message, not a traceback; LIT_AGENTRL_TRACEBACK=1 shows it."""

from __future__ import annotations

import re

import pytest
from support import REPO_ROOT, quick_config

from lit_agentrl.cli import EXIT_USER_ERROR, find_user_error, main
from lit_agentrl.errors import UserInputError

QUICKSTART = str(REPO_ROOT / "configs" / "quickstart.yaml")
BAD_LR = ["fit", "--config", QUICKSTART, "--model.optimizer.lr", "0"]  # refused when GRPOModule is built


def test_a_user_input_error_prints_one_message(capsys, monkeypatch):
    monkeypatch.delenv("LIT_AGENTRL_TRACEBACK", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        main(BAD_LR)
    assert exit_info.value.code == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert err.splitlines()[0] == "lit-agentrl: error: model.optimizer.lr must be > 0, got 0.0"
    assert "Traceback" not in err and len(err.splitlines()) <= 3
    assert "LIT_AGENTRL_TRACEBACK=1" in err


def test_the_traceback_is_one_variable_away(monkeypatch):
    monkeypatch.setenv("LIT_AGENTRL_TRACEBACK", "1")
    with pytest.raises(UserInputError, match=r"model\.optimizer\.lr must be > 0"):
        main(BAD_LR)


def test_the_hint_is_printed(capsys, monkeypatch):
    monkeypatch.delenv("LIT_AGENTRL_TRACEBACK", raising=False)
    with pytest.raises(SystemExit):
        main(["fit", "--config", QUICKSTART, "--trainer.gradient_clip_val", "1"])
    assert capsys.readouterr().err.splitlines()[1].startswith("hint: use model.grad_clip")


def test_wrapped_user_errors_are_found():
    try:
        try:
            raise UserInputError("data.train_files: no such file", hint="check the path")
        except UserInputError as inner:
            raise RuntimeError("a hook failed") from inner
    except RuntimeError as outer:
        found = find_user_error(outer)
    assert found is not None and found.message == "data.train_files: no such file" and found.hint == "check the path"
    assert find_user_error(RuntimeError("a bug")) is None


def test_a_user_error_of_a_spawned_process_is_found():
    """torch.multiprocessing passes a child's exception on as the text of its traceback."""
    from torch.multiprocessing import ProcessRaisedException

    text = (
        "\n\n-- Process 1 terminated with the following error:\nTraceback (most recent call last):\n"
        '  File "x.py", line 1, in f\nlit_agentrl.errors.UserInputError: model.optimizer.lr must be > 0, got 0.0\n'
    )
    found = find_user_error(ProcessRaisedException(text, 1, 1234))
    assert found is not None and found.message == "model.optimizer.lr must be > 0, got 0.0"
    assert find_user_error(ProcessRaisedException("ValueError: a bug", 1, 1234)) is None


def test_a_parse_error_is_short(capsys):
    """jsonargparse's error, after a one-line usage (not the ~90 options: `fit --help` lists them)."""
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", QUICKSTART, "--model.optimizer.lr", "abc"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert 'Parser key "model.optimizer.lr"' in err and len(err.splitlines()) <= 6, err


def test_a_renamed_key_is_refused_naming_its_replacement(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("LIT_AGENTRL_TRACEBACK", raising=False)
    config = tmp_path / "old.yaml"
    config.write_text(
        "trainer:\n  callbacks:\n    - class_path: lit_agentrl.callbacks.RolloutCallback\n"
        "      init_args: {mode: async, max_staleness: 1, engine_kwargs: {}}\n"
    )
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", QUICKSTART, "--config", str(config)])
    assert exit_info.value.code == EXIT_USER_ERROR
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"lit-agentrl: error: {config}: RolloutCallback.mode has been replaced"
    assert err[1].startswith("hint: use RolloutCallback.async_rollouts: null (sync) or {ahead: 1}")
    config.write_text(
        "trainer:\n  callbacks:\n    - class_path: RolloutCallback\n      init_args: {engine_kwargs: {dtype: float32}}\n"
    )
    with pytest.raises(SystemExit):
        main(["fit", "--config", QUICKSTART, "--config", str(config)])
    assert capsys.readouterr().err.splitlines()[1] == "hint: use RolloutCallback.engine: {name: ..., kwargs: {...}}"
    with pytest.raises(SystemExit):
        main(["fit", "--config", QUICKSTART, "--model.normalize_advantage_std", "false"])
    err = capsys.readouterr().err.splitlines()
    assert err[0].endswith(
        "the option --model.normalize_advantage_std: model.normalize_advantage_std has been replaced"
    )
    assert err[1].startswith("hint: use model.loss.advantage_std: sample, population")
    with pytest.raises(SystemExit):
        main(["fit", "--config", QUICKSTART, "--model.lr=0.1"])
    assert capsys.readouterr().err.splitlines()[1] == "hint: use model.optimizer.lr"


@pytest.mark.parametrize(
    "module, message",
    [
        (
            "missing_agents.py",
            r"data\.agent_modules: the file 'missing_agents\.py' does not exist \(relative to the working directory '.+'\)",
        ),
        (
            "no_such_package.agents",
            r"data\.agent_modules: 'no_such_package\.agents' does not import \(No module named 'no_such_package'\)",
        ),
    ],
)
def test_an_agent_module_that_is_not_there_is_one_message(
    module, message, tmp_path, quickstart_model_dir, capsys, monkeypatch
):
    monkeypatch.delenv("LIT_AGENTRL_TRACEBACK", raising=False)
    monkeypatch.chdir(tmp_path)
    config = quick_config(tmp_path, quickstart_model_dir, steps=1)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(config), f"--data.agent_modules=[{module}]"])
    assert exit_info.value.code == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert re.fullmatch(message, err.splitlines()[0].removeprefix("lit-agentrl: error: ")), err
    assert "Traceback" not in err
