"""Run config files built in code (lit_agentrl.config.run_file): dotted overrides of a shipped config."""

from __future__ import annotations

import pytest
import yaml
from support import REPO_ROOT

from lit_agentrl.config.run_file import rollout_args, set_keys

CONFIG_8B = REPO_ROOT / "configs" / "qwen3_8b_math_agent.yaml"


def test_dotted_keys_reach_sections_the_rollout_callback_and_list_entries_by_class():
    config = set_keys(
        yaml.safe_load(CONFIG_8B.read_text()),
        {
            "seed_everything": 1,
            "trainer.devices": 2,
            "rollout.engine.kwargs.device": "cpu",
            "trainer.callbacks.ModelCheckpoint.init_args.every_n_train_steps": 3,
            "data.new_group.key": "made",
        },
    )
    assert config["seed_everything"] == 1 and config["trainer"]["devices"] == 2
    assert rollout_args(config)["engine"]["kwargs"] == {
        "dtype": "bfloat16", "mem_fraction_static": 0.85, "enable_memory_saver": True, "device": "cpu"
    }  # fmt: skip
    assert config["trainer"]["callbacks"][1]["init_args"]["every_n_train_steps"] == 3
    assert config["trainer"]["callbacks"][1]["init_args"]["save_top_k"] == 2  # the rest kept
    assert config["data"]["new_group"] == {"key": "made"}


def test_a_class_the_list_does_not_hold_is_named_with_what_it_holds():
    with pytest.raises(
        KeyError, match=r"no EarlyStopping in the list, which holds \['RolloutCallback', 'ModelCheckpoint'"
    ):
        set_keys(yaml.safe_load(CONFIG_8B.read_text()), {"trainer.callbacks.EarlyStopping.init_args.patience": 1})
    with pytest.raises(KeyError, match=r"no RolloutCallback under trainer\.callbacks"):
        rollout_args({"trainer": {"callbacks": []}})
