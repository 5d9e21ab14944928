"""``--trainer.callbacks.<index or class>.<key> VALUE``: one callback's argument from the command line, whichever
place it holds in the config's list (jsonargparse alone reaches only the last entry)."""

from __future__ import annotations

import pytest
import yaml
from support import REPO_ROOT

from lit_agentrl.callbacks import HFExportCallback, RolloutCallback
from lit_agentrl.cli import main, parse_run
from lit_agentrl.config.callback_overrides import split_item_overrides
from lit_agentrl.errors import UserInputError

QUICKSTART = str(REPO_ROOT / "configs" / "quickstart.yaml")
# RolloutCallback first, then ModelCheckpoint and HFExportCallback: the rollout callback is not the last entry.
CONFIG_8B = str(REPO_ROOT / "configs" / "qwen3_8b_math_agent.yaml")


def callbacks(*args: str) -> dict[str, object]:
    return {type(c).__name__: c for c in parse_run(["--config", CONFIG_8B, *args]).callbacks}


def test_an_entry_is_picked_by_its_index_or_its_class_name():
    built = callbacks(
        "--trainer.callbacks.0.init_args.train.n_samples",
        "4",
        "--trainer.callbacks.RolloutCallback.train.sampling_params={max_new_tokens: 16, temperature: 0.7}",
        "--trainer.callbacks.2.every_n_steps=7",
    )
    rollout, export = built["RolloutCallback"], built["HFExportCallback"]
    assert isinstance(rollout, RolloutCallback) and isinstance(export, HFExportCallback)
    assert rollout.settings.train.n_samples == 4 and rollout.settings.train.sampling.max_new_tokens == 16
    assert rollout.settings.engine.name == "sglang"  # the rest of the entry as the config has it
    assert export.every_n_steps == 7


def test_jsonargparse_s_own_last_entry_form_still_works():
    assert callbacks("--trainer.callbacks.init_args.every_n_steps", "9")["HFExportCallback"].every_n_steps == 9


@pytest.mark.parametrize(
    "args, message",
    [
        (["--trainer.callbacks.5.train.n_samples", "4"], r"no entry 5; trainer\.callbacks holds \['RolloutCallbac"),
        (["--trainer.callbacks.EarlyStopping.patience", "4"], r"no EarlyStopping in the list; trainer\.callbacks hol"),
        (["--trainer.callbacks.0.train.n_samples", "four"], r"0\.train\.n_samples 'four': .*Expected a <class 'int'>"),
        (["--trainer.callbacks.0.n_samplez", "4"], r"callbacks\.0\.n_samplez '4': .*'n_samplez' is not accepted"),
        (["--trainer.callbacks.0.train.n_samples"], r"--trainer\.callbacks\.0\.train\.n_samples needs a value"),
        (["--trainer.callbacks.RolloutCallback.n_samples", "4"], r"RolloutCallback\.n_samples has been replaced"),
    ],
)
def test_a_bad_entry_or_value_is_named(args, message):
    with pytest.raises(UserInputError, match=message):
        callbacks(*args)


def test_the_override_is_in_the_printed_config(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", QUICKSTART, "--trainer.callbacks.0.train.n_samples", "3", "--print_config"])
    assert exit_info.value.code == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["trainer"]["callbacks"][0]["init_args"]["train"]["n_samples"] == 3


def test_other_arguments_are_left_to_jsonargparse():
    rest, overrides = split_item_overrides(
        ["fit", "--trainer.callbacks.init_args.x", "1", "--trainer.callbacks+=X", "--trainer.callbacks.Y.z=2"]
    )
    assert rest == ["fit", "--trainer.callbacks.init_args.x", "1", "--trainer.callbacks+=X"]
    assert [(o.selector, o.key, o.value) for o in overrides] == [("Y", "z", "2")]
