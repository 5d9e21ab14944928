"""``model.lora.target_modules``: peft's spellings (names, ``all-linear``, a regular expression), each entry checked
against the model before the first step, the head and the embeddings refused however they are spelled."""

from __future__ import annotations

import pytest
from support import quick_config
from transformers import AutoModelForCausalLM

from lit_agentrl.callbacks import RolloutCallback
from lit_agentrl.cli import main
from lit_agentrl.config.training import QWEN_LINEAR_MODULES, Lora
from lit_agentrl.errors import UserInputError
from lit_agentrl.models.lora_names import is_adapter
from lit_agentrl.plan import lora_parameters
from lit_agentrl.training.lora import target_module_names
from lit_agentrl.training.module import GRPOModule

LINEAR_NAMES = r"the model's linear layers are named \['down_proj', 'gate_proj', 'k_proj', 'o_proj', 'q_proj', "


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir)


def adapted_modules(model_dir, targets) -> set[str]:
    """The modules that got trainable adapters when the policy was built with ``targets``."""
    module = GRPOModule(str(model_dir), lora=Lora(rank=2, base_dtype="float32", target_modules=targets))
    module.configure_model()
    trained = [name for name, p in module.policy.named_parameters() if p.requires_grad]
    assert trained and all(is_adapter(name) for name in trained)
    return {name.split(".lora_")[0] for name in trained}


def test_a_typo_beside_good_names_is_named_before_anything_trains(tiny_model_dir):
    """peft injects the names it finds and drops the rest: ``v_prj`` would have left v_proj untrained."""
    module = GRPOModule(str(tiny_model_dir), lora=Lora(rank=2, target_modules=("q_proj", "v_prj")))
    with pytest.raises(UserInputError, match=r"\['v_prj'\] match no module of the model; " + LINEAR_NAMES):
        module.configure_model()


@pytest.mark.parametrize(
    "targets", [("model.embed_tokens",), ("q_proj", "lm_head"), ("layers.0.mlp.up_proj", "embed_tokens")]
)
def test_the_head_and_the_embeddings_are_refused_by_name_or_path_when_the_config_is_built(targets):
    with pytest.raises(UserInputError, match=r"names the head or the embeddings .*take no adapters"):
        Lora(rank=2, target_modules=targets)


@pytest.mark.parametrize("pattern", [r".*embed_tokens", r"lm_head|.*q_proj", r".*"])
def test_a_pattern_that_selects_the_head_or_the_embeddings_is_refused(tiny, pattern):
    with pytest.raises(UserInputError, match=r"selects \[.*(embed_tokens|lm_head).*take no adapters"):
        target_module_names(tiny, Lora(rank=2, target_modules=pattern))


def test_all_linear_is_every_linear_layer_but_the_head(tiny_model_dir):
    adapted = adapted_modules(tiny_model_dir, "all-linear")
    assert adapted == adapted_modules(tiny_model_dir, QWEN_LINEAR_MODULES)
    assert len(adapted) == 2 * 7 and not any("lm_head" in name for name in adapted)  # 2 layers x 7 linears


def test_a_pattern_selects_by_whole_names_as_peft_does(tiny_model_dir):
    assert adapted_modules(tiny_model_dir, r"model\.layers\.0\.self_attn\.(q|v)_proj") == {
        "model.layers.0.self_attn.q_proj",
        "model.layers.0.self_attn.v_proj",
    }
    assert adapted_modules(tiny_model_dir, ("self_attn.o_proj",)) == {
        f"model.layers.{i}.self_attn.o_proj" for i in range(2)
    }


def test_one_name_as_a_string_is_a_pattern_that_matches_nothing(tiny):
    with pytest.raises(UserInputError, match=r"target_modules=q_proj matches no module") as info:
        target_module_names(tiny, Lora(rank=2, target_modules="q_proj"))
    assert "a list ([q_proj, v_proj]) matches by name" in (info.value.hint or "")


def test_a_selection_of_modules_that_are_not_linear_layers_is_refused(tiny):
    with pytest.raises(UserInputError, match=r"not linear layers: \['model\.layers\.0\.mlp \(Qwen3MLP\)'"):
        target_module_names(tiny, Lora(rank=2, target_modules=("mlp",)))


def test_a_bad_pattern_and_a_pattern_with_adapter_sync_are_refused_when_the_config_is_built():
    with pytest.raises(UserInputError, match=r"target_modules='\(' is not a regular expression"):
        Lora(rank=2, target_modules="(")
    with pytest.raises(UserInputError, match=r"target_modules='all-linear': model\.lora\.sync: adapter"):
        Lora(rank=2, target_modules="all-linear", sync="adapter")


def test_the_plan_counts_the_modules_training_adapts(tiny_model_dir, tiny):
    per_layer = sum(m.in_features + m.out_features for n, m in tiny.model.layers[0].named_modules() if "proj" in n)
    every = lora_parameters(str(tiny_model_dir), Lora(rank=3))
    assert every == lora_parameters(str(tiny_model_dir), Lora(rank=3, target_modules="all-linear")) == 3 * 2 * per_layer
    with pytest.raises(UserInputError, match=r"\['qkv'\] match no module"):
        lora_parameters(str(tiny_model_dir), Lora(rank=3, target_modules=("qkv",)))


def test_fit_names_a_typo_before_any_engine_starts(tmp_path, quickstart_model_dir, capsys, monkeypatch):
    monkeypatch.delenv("LIT_AGENTRL_TRACEBACK", raising=False)
    monkeypatch.chdir(tmp_path)
    started: list[str] = []  # the engines start in RolloutCallback.setup, minutes for SGLang on a large model
    monkeypatch.setattr(RolloutCallback, "setup", lambda self, trainer, module, stage: started.append(stage))
    config = quick_config(tmp_path, quickstart_model_dir, steps=1)
    lora = ["--model.lora.rank", "2", "--model.lora.target_modules", "[q_proj, v_prj]"]
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(config), *lora])
    assert exit_info.value.code == 2
    assert "model.lora.target_modules=['q_proj', 'v_prj']: ['v_prj'] match no module" in capsys.readouterr().err
    assert started == []
