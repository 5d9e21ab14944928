"""Bad configurations fail before the first step, naming the option at fault."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from support import quick_config, read_csv

from lit_agentrl.callbacks import RolloutCallback
from lit_agentrl.cli import main
from lit_agentrl.config.rollout import AsyncRollouts, DynamicSampling, Health, TrainRollouts, ValidationRollouts
from lit_agentrl.config.training import Compute, Lora, Loss, Optimizer
from lit_agentrl.training.module import GRPOModule


def run_with(tmp_path, model_dir, edit, capsys) -> str:
    """The one-line message ``lit-agentrl fit`` prints for the edited config (it exits with status 2)."""
    path = quick_config(tmp_path, model_dir, steps=1)
    config = yaml.safe_load(path.read_text())
    edit(config)
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.splitlines()[0]


def callback_args(config: dict) -> dict:
    return config["trainer"]["callbacks"][0]["init_args"]


@pytest.mark.slow
def test_the_trainer_computes_log_probs_at_the_temperature_the_rollout_was_sampled_at(tmp_path, quickstart_model_dir):
    """One temperature, the sampler's: the engine's log-probs (at 0.7) are the trainer's own, so the first update's
    ratio is 1 (the trainer at 1.0 would be off by the temperature, ratio far from 1)."""
    path = quick_config(tmp_path, quickstart_model_dir, steps=2)
    config = yaml.safe_load(path.read_text())
    callback_args(config)["train"]["sampling_params"]["temperature"] = 0.7
    path.write_text(yaml.safe_dump(config))
    main(["fit", "--config", str(path)])
    rows = [r for r in read_csv(next((tmp_path / "logs").rglob("metrics.csv"))) if r.get("train/ratio_mean")]
    assert abs(float(rows[0]["train/ratio_mean"]) - 1.0) < 1e-4 and abs(float(rows[0]["train/approx_kl"])) < 1e-4


@pytest.mark.slow
def test_unknown_engine(tmp_path, quickstart_model_dir, capsys):
    def edit(c):
        callback_args(c)["engine"] = "vllm"

    assert "unknown rollout engine 'vllm'" in run_with(tmp_path, quickstart_model_dir, edit, capsys)


@pytest.mark.slow
def test_model_path_without_weights(tmp_path, quickstart_model_dir, capsys):
    empty = tmp_path / "empty-model"
    empty.mkdir()

    def edit(c):
        c["model"]["model_path"] = str(empty)

    assert "empty-model" in run_with(tmp_path, quickstart_model_dir, edit, capsys)


@pytest.mark.slow
def test_tokenizer_without_chat_template(tmp_path, quickstart_model_dir, capsys):
    plain = shutil.copytree(quickstart_model_dir, tmp_path / "no-template")
    (plain / "chat_template.jinja").unlink(missing_ok=True)
    config = plain / "tokenizer_config.json"
    data = json.loads(config.read_text())
    data.pop("chat_template", None)
    config.write_text(json.dumps(data))

    def edit(c):
        c["model"]["model_path"] = str(plain)

    assert "has no chat template" in run_with(tmp_path, quickstart_model_dir, edit, capsys)


@pytest.mark.parametrize(
    "build, fragment",
    [
        (lambda: TrainRollouts(sampling_params={"top_p": 2}), r"RolloutCallback\.train\.sampling_params: top_p"),
        (lambda: ValidationRollouts(sampling_params={"stop_regex": "x"}), r"validation\.sampling_params: unknown key"),
        (lambda: TrainRollouts(n_samples=0), r"RolloutCallback\.train\.n_samples must be >= 1"),
        (lambda: TrainRollouts(sampling_params={"temperature": 0}), r"train\.sampling_params\.temperature=0: training"),
        (
            lambda: TrainRollouts(sampling_params={"n": 4}),
            r"train\.sampling_params\.n=4: .*set RolloutCallback\.train\.n_s",
        ),
        (
            lambda: ValidationRollouts(sampling_params={"n": 2}),
            r"sampling_params\.n=2: .*set RolloutCallback\.validation\.n_",
        ),
        (
            lambda: ValidationRollouts(n_samples=2, pass_k=(1, 4)),
            r"validation\.pass_k=\[1, 4\] needs k <= .*n_samples=2",
        ),
        (lambda: ValidationRollouts(pass_k=(0,)), r"RolloutCallback\.validation\.pass_k must be .* k >= 1"),
        (lambda: DynamicSampling(max_rounds=0), r"RolloutCallback\.train\.dynamic_sampling\.max_rounds must be >= 1"),
        (lambda: Health(max_failed_fraction=2), r"RolloutCallback\.health\.max_failed_fraction"),
        (lambda: Health(trajectory_timeout_s=0), r"RolloutCallback\.health\.trajectory_timeout_s"),
        (
            lambda: RolloutCallback(
                train=TrainRollouts(dynamic_sampling=DynamicSampling()), async_rollouts=AsyncRollouts()
            ),
            r"async_rollouts does not combine with train\.dynamic_sampling",
        ),
    ],
)
def test_bad_callback_arguments_name_their_key(build, fragment):
    with pytest.raises(ValueError, match=fragment):
        build()


def test_validation_may_decode_greedily():
    validation = ValidationRollouts(sampling_params={"temperature": 0})
    assert RolloutCallback(validation=validation).settings.validation.sampling.temperature == 0


@pytest.mark.parametrize(
    "build, fragment",
    [
        (lambda: Optimizer(lr=0), r"model\.optimizer\.lr"),
        (lambda: Loss(clip_ratio_low=1.5), r"model\.loss\.clip_ratio_low"),
        (lambda: Loss(aggregation="sum"), r"model\.loss\.aggregation"),
        (lambda: Compute(param_dtype="float8"), r"model\.compute\.param_dtype"),
        (lambda: Lora(rank=0), r"model\.lora\.rank must be >= 1"),
        (lambda: Lora(rank=8, sync="delta"), r"model\.lora\.sync"),
        (lambda: Lora(rank=8, target_modules=("q_proj", "lm_head")), r"the head and the embeddings take no adapters"),
        (lambda: Lora(rank=8, dropout=1.0), r"model\.lora\.dropout"),
    ],
)
def test_bad_module_arguments(build, fragment):
    with pytest.raises(ValueError, match=fragment):
        build()


def test_bf16_without_a_device_mesh_is_refused_not_ignored(quickstart_model_dir):
    """bf16 is FSDP2's mixed precision; without the strategy it used to train in fp32 silently."""
    module = GRPOModule(str(quickstart_model_dir), compute=Compute(param_dtype="bfloat16"))
    with pytest.raises(
        ValueError, match=r"model\.compute\.param_dtype=bfloat16 .* no device mesh.*ModelParallelStrategy"
    ):
        module.configure_model()


def test_stop_strings_with_an_sglang_engine_are_refused_when_the_callback_is_built():
    """SGLang runs without a tokenizer here and refuses stop strings on every request: say so before any engine."""
    with pytest.raises(ValueError, match=r"RolloutCallback\.validation\.sampling_params\.stop=.*skip_tokenizer_init"):
        RolloutCallback(engine="sglang", validation=ValidationRollouts(sampling_params={"stop": ["\n\n"]}))
