"""``lit-agentrl``: LightningCLI over GRPOModule and AgentPromptDataModule.

lit-agentrl fit --config configs/quickstart.yaml
lit-agentrl validate --config configs/quickstart.yaml --ckpt_path PATH
lit-agentrl plan --config configs/qwen3_8b_math_agent.yaml [--gpu-memory-gb 80] [--devices N] [--KEY VALUE ...]
lit-agentrl view RUN_DIR [--out FILE] [--serve [--port N]] [--max-trajectories N]
lit-agentrl pool --model-path PATH --gpus 4,5,6,7 --discovery-file FILE [...]   (SGLang servers behind the router)

A configuration or data error (:class:`~lit_agentrl.errors.UserInputError`) is printed as one message and the
command exits with status 2, as for a command-line error; ``LIT_AGENTRL_TRACEBACK=1`` shows its full traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jsonargparse import Namespace
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint, ProgressBar
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import CSVLogger, Logger, WandbLogger

# The package: `class_path: RolloutCallback` resolves by name.
from lit_agentrl.callbacks import StepProgressBar, TrajectoryLog
from lit_agentrl.config.callback_overrides import apply_item_overrides, split_item_overrides
from lit_agentrl.config.renamed import refuse_renamed_keys
from lit_agentrl.data import AgentPromptDataModule
from lit_agentrl.errors import UserInputError
from lit_agentrl.plan import GB, REMOTE_ENGINES, PlanInputs, inputs_from_run, plan_memory, trainer_layout
from lit_agentrl.plan_servers import plan_servers
from lit_agentrl.training.module import GRPOModule

REWARD_KEY = "rollout/reward_mean"
DEFAULT_ROOT_DIR = "outputs"
TRACEBACK_ENV = "LIT_AGENTRL_TRACEBACK"
EXIT_USER_ERROR = 2  # argparse's (and jsonargparse's) status for a bad command line
# The data module splits prompts across ranks itself; checkpoint files are written atomically (a class_path, so the
# saved config names it and re-runs); whatever a run writes without a folder of its own (logs, checkpoints, the
# saved config) goes under outputs/.
TRAINER_DEFAULTS: dict[str, Any] = {
    "use_distributed_sampler": False,
    "plugins": [{"class_path": "lit_agentrl.training.checkpoint.AtomicCheckpointIO"}],
    "default_root_dir": DEFAULT_ROOT_DIR,
}
HELP_EPILOG = (
    "Callbacks' options: --trainer.callbacks.help RolloutCallback (or any callback's class name). "
    "Lightning's gradient_clip_val, accumulate_grad_batches, precision, --optimizer and --lr_scheduler do not apply "
    "(GRPOModule optimises manually): use model.grad_clip, model.mini_batches, model.param_dtype, model.lr and "
    "model.lr_schedule."
)
# Argparse's usage would list all ~90 options before every parse error; `--help` lists them with their documentation.
SUBCOMMAND_PARSER_KWARGS = {"usage": "%(prog)s [-c CONFIG] [--print_config] [--KEY VALUE ...]", "epilog": HELP_EPILOG}


class AgentRLCLI(LightningCLI):
    """LightningCLI with the subcommands GRPOModule supports, Lightning options that do not apply to it refused, a
    step progress bar, a memory plan before a GPU ``fit``, and a summary of the reward after it."""

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        # GRPOModule has no test_step or predict_step: Lightning's `test` and `predict` would crash.
        return {name: skip for name, skip in LightningCLI.subcommands().items() if name in ("fit", "validate")}

    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.link_arguments("model.model_path", "data.tokenizer_path")
        parser.add_argument(
            "--skip_memory_plan", type=bool, default=False, help="start a GPU run even if `lit-agentrl plan` refuses it"
        )
        parser.add_argument(
            "--trajectory_log",
            type=bool,
            default=True,
            help="log a sample of each step's trajectories (TrajectoryLog with its defaults; `lit-agentrl view` shows "
            "them) unless trainer.callbacks has a TrajectoryLog of its own",
        )

    def parse_arguments(self, parser: Any, args: Any) -> None:
        """jsonargparse's parse, then the list-entry overrides it cannot take (``--trainer.callbacks.N.KEY VALUE``,
        :mod:`lit_agentrl.config.callback_overrides`). ``args`` (or else ``sys.argv``) is the whole command line, so
        Lightning's warning about ``args`` given beside ``sys.argv`` (``lit-agentrl plan``, tests) does not apply."""
        if isinstance(args, dict | Namespace):
            return super().parse_arguments(parser, args)
        rest, overrides = split_item_overrides(list(sys.argv[1:] if args is None else args))
        printing = [arg for arg in rest if arg.split("=", 1)[0] == "--print_config"]
        if overrides and printing:  # jsonargparse prints inside its parse, before the overrides are applied
            if printing != ["--print_config"]:
                raise UserInputError(f"{printing[0]} with {overrides[0].arg}: give --print_config without flags")
            rest.remove("--print_config")
        self.config = parser.parse_args(rest)
        subcommand = self.config.get("subcommand")
        settings = self.config[subcommand] if subcommand else self.config
        apply_item_overrides(settings, overrides)
        if overrides and printing:
            sys.stdout.write((self._subcommand_parsers[subcommand] if subcommand else parser).dump(settings))
            raise SystemExit(0)
        return None

    def before_instantiate_classes(self) -> None:
        refuse_manual_optimization_options(self.config[self.subcommand] if self.subcommand else self.config)

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """The configured trainer, plus the reward history for the summary, unless the config has its own or turns
        them off the step progress bar and the trajectory log (not in the saved config: the CLI adds them on every
        run)."""
        trainer_config = self._get(self.config_init, "trainer", default={})
        callbacks = _as_list(kwargs.pop("callbacks", trainer_config.get("callbacks")))
        self.reward_history = RewardHistory()
        callbacks.append(self.reward_history)
        if _wants_default_progress_bar(trainer_config, callbacks):
            callbacks.append(StepProgressBar())
        settings = self.config[self.subcommand] if self.subcommand else self.config
        if settings.get("trajectory_log", True) and not any(isinstance(c, TrajectoryLog) for c in callbacks):
            callbacks.append(TrajectoryLog())
        return super().instantiate_trainer(callbacks=callbacks, **kwargs)

    def before_fit(self) -> None:
        """Refuse LoRA targets the model lacks, and a GPU run that cannot fit (``lit_agentrl.plan``), before any weight
        is loaded or any engine starts."""
        check_lora_targets(self.model)
        settings = self.config[self.subcommand]
        if settings.get("skip_memory_plan") or not _plans_gpu_memory(settings):
            return
        import torch

        gpu_memory = torch.cuda.get_device_properties(0).total_memory
        rollout = next((c for c in self.trainer.callbacks if type(c).__name__ == "RolloutCallback"), None)  # type: ignore[attr-defined]
        layout = trainer_layout(settings.get("trainer"))
        checkpoint = self.trainer.checkpoint_callback
        plan = plan_memory(inputs_from_run(self.model, rollout, self.datamodule, layout, gpu_memory, checkpoint))
        if not plan.fits:
            raise SystemExit(
                f"lit-agentrl fit: the run does not fit on this GPU ({gpu_memory / 1e9:.0f} GB): "
                f"{'; '.join(plan.reasons)}. `lit-agentrl plan --config ...` prints the whole plan; "
                "--skip_memory_plan true starts it anyway."
            )

    def before_validate(self) -> None:
        check_lora_targets(self.model)

    def after_fit(self) -> None:
        if not self.trainer.is_global_zero:
            return
        for logger in self.trainer.loggers:
            where = logger_location(logger)
            if where:
                print(where)
        summary = reward_summary(self.reward_history.rewards)
        if summary:
            print(summary)


class RewardHistory(Callback):
    """``rollout/reward_mean`` of every training step, whatever the logger (or none): the end-of-run summary's."""

    def __init__(self) -> None:
        self.rewards: list[float] = []

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        value = trainer.callback_metrics.get(REWARD_KEY)
        if value is not None:
            self.rewards.append(float(value))


# ---------------------------------------------------------------------------------------------- refused options

# (key, applies when, why it does not, what to use instead)
_REFUSED: list[tuple[str, Any, str, str]] = [
    (
        "trainer.gradient_clip_val",
        lambda v: v is not None,
        "GRPOModule clips its own gradients (Lightning does not clip under manual optimisation)",
        "model.grad_clip (the max gradient norm; null: no clipping)",
    ),
    (
        "trainer.gradient_clip_algorithm",
        lambda v: v is not None,
        "GRPOModule clips its own gradients, by norm",
        "model.grad_clip",
    ),
    (
        "trainer.accumulate_grad_batches",
        lambda v: v not in (None, 1),
        "a step's rollout is one batch, already accumulated over micro-batches",
        "model.micro_batch_tokens (memory per forward/backward), data.prompts_per_step (samples per step) or "
        "model.mini_batches (optimizer steps per step)",
    ),
    (
        "trainer.precision",
        lambda v: v not in (None, 32, "32", "32-true"),
        "GRPOModule sets its own precision",
        "model.param_dtype: bfloat16 (FSDP2 mixed precision: trainer.strategy ModelParallelStrategy, "
        "data_parallel_size: 1 on one device) or float32",
    ),
    (
        "optimizer",
        lambda v: v is not None,
        "GRPOModule builds its own AdamW",
        "model.lr, model.weight_decay, model.betas",
    ),
    (
        "lr_scheduler",
        lambda v: v is not None,
        "GRPOModule builds its own schedule",
        "model.lr_schedule (constant or cosine) and model.warmup_steps",
    ),
]


def refuse_manual_optimization_options(settings: Any) -> None:
    """Raise :class:`UserInputError` for a Lightning option that GRPOModule's manual optimisation ignores or breaks,
    naming the option to use instead."""
    for key, applies, why, instead in _REFUSED:
        value = settings.get(key)
        if applies(value):
            shown = value.get("class_path", value) if hasattr(value, "get") else value
            raise UserInputError(f"{key}={shown!r} does not apply: {why}", hint=f"use {instead}")


# ---------------------------------------------------------------------------------------------- after the run


def logger_location(logger: Logger) -> str | None:
    """Where a logger put the run: the metrics file of a CSVLogger, the run folder (or page) of wandb, else its
    log folder."""
    if isinstance(logger, CSVLogger):
        return f"metrics: {Path(logger.log_dir) / 'metrics.csv'}"
    if isinstance(logger, WandbLogger):
        run = logger.experiment
        url = getattr(run, "url", None)
        return f"wandb: {url}" if url else f"wandb: {Path(run.dir).parent}"
    log_dir = getattr(logger, "log_dir", None)
    return f"logs: {log_dir}" if log_dir else None


def reward_summary(rewards: list[float]) -> str | None:
    """``rollout/reward_mean`` over the first and the last fifth of the steps (None under 5 steps)."""
    if len(rewards) < 5:
        return None
    fifth = len(rewards) // 5
    first, last = statistics.fmean(rewards[:fifth]), statistics.fmean(rewards[-fifth:])
    return f"{REWARD_KEY}: first fifth {first:.3f} -> last fifth {last:.3f} ({last - first:+.3f}) over {len(rewards)} steps"


# ---------------------------------------------------------------------------------------------- helpers


def check_lora_targets(module: LightningModule) -> None:
    """``model.lora.target_modules`` checked on the model built on the meta device (a second or so for 8B), so a typo
    is named before the engines start, not only when the policy is built after them. Without the model's config
    the usual error comes later, naming the path."""
    lora = getattr(module, "lora", None)
    model_path = str(getattr(module, "model_path", ""))
    if lora is not None and lora.enabled and (Path(model_path) / "config.json").is_file():
        from lit_agentrl.models.skeleton import empty_model
        from lit_agentrl.training.lora import target_module_names

        target_module_names(empty_model(model_path), lora)


def _as_list(callbacks: Any) -> list[Callback]:
    if callbacks is None:
        return []
    return list(callbacks) if isinstance(callbacks, list | tuple) else [callbacks]


def _wants_default_progress_bar(trainer_config: Any, callbacks: list[Callback]) -> bool:
    """As Lightning adds its own bar: when the progress bar is on and the config names none."""
    off = trainer_config.get("enable_progress_bar") is False or trainer_config.get("barebones")
    return not off and not any(isinstance(c, ProgressBar) for c in callbacks)


def _plans_gpu_memory(settings: Any) -> bool:
    """Whether the run trains on CUDA GPUs with an engine the planner models (CPU runs need no plan)."""
    import torch

    accelerator = str(settings.get("trainer.accelerator", "auto"))
    return torch.cuda.is_available() and accelerator in ("auto", "gpu", "cuda")


@dataclass
class ParsedRun:
    """A config as ``lit-agentrl fit`` would run it, its classes built but no Trainer, no model weights, no engine."""

    module: GRPOModule
    data: Any
    callbacks: list[Callback]
    trainer: Any
    """The parsed ``trainer`` settings (a namespace)."""


class _ConfigOnlyCLI(AgentRLCLI):
    """The CLI's parse of a config and the classes it names (the module, the data module, the callbacks), without the
    Trainer (whose accelerator may not be on this machine)."""

    def instantiate_classes(self) -> None:
        self.config_init = self.parser.instantiate_classes(self.config)
        self.model = self._get(self.config_init, "model")
        self.datamodule = self._get(self.config_init, "data")


def parse_run(args: list[str]) -> ParsedRun:
    """The run ``lit-agentrl fit ARGS`` would start, parsed and built as :class:`ParsedRun` (``lit-agentrl plan``)."""
    refuse_renamed_keys(args)
    cli = _ConfigOnlyCLI(
        GRPOModule, AgentPromptDataModule, trainer_defaults=TRAINER_DEFAULTS, args=args, run=False,
        parser_kwargs={"prog": "lit-agentrl plan"},
    )  # fmt: skip
    callbacks = _as_list(cli._get(cli.config_init, "trainer").get("callbacks"))
    return ParsedRun(cli.model, cli.datamodule, callbacks, cli._get(cli.config, "trainer"))


def build_cli(args: list[str] | None = None, run: bool = True, **kwargs: Any) -> AgentRLCLI:
    """The CLI as ``lit-agentrl`` builds it (tests build it with ``run=False``)."""
    return AgentRLCLI(
        GRPOModule,
        AgentPromptDataModule,
        trainer_defaults={**TRAINER_DEFAULTS, **kwargs.pop("trainer_defaults", {})},
        save_config_kwargs={"overwrite": True},
        parser_kwargs={"prog": "lit-agentrl", **{name: SUBCOMMAND_PARSER_KWARGS for name in AgentRLCLI.subcommands()}},
        args=args,
        run=run,
        **kwargs,
    )


# ---------------------------------------------------------------------------------------------- lit-agentrl plan


def inputs_from_args(args: list[str], gpu_memory: int = 80 * GB, devices: int | None = None) -> PlanInputs:
    """:class:`PlanInputs` of the run ``lit-agentrl fit ARGS`` would start (``--config FILE``, ``--KEY VALUE``): the
    CLI parses the config and builds the module, the data module and the callbacks, but no Trainer and no model.
    ``devices`` replaces the config's devices and data-parallel size."""
    run = parse_run(args)
    layout = trainer_layout(run.trainer)
    if devices is not None:
        layout = dataclasses.replace(layout, devices=devices, data_parallel_size=devices)
    rollout = next((c for c in run.callbacks if type(c).__name__ == "RolloutCallback"), None)
    checkpoint = next((c for c in run.callbacks if isinstance(c, ModelCheckpoint)), None)
    return inputs_from_run(run.module, rollout, run.data, layout, gpu_memory, checkpoint)


def inputs_from_config(config: dict[str, Any], gpu_memory: int = 80 * GB) -> PlanInputs:
    """:func:`inputs_from_args` of a config given as a dict (written to a temporary file for the CLI to parse)."""
    import tempfile

    import yaml

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(config, f)
    try:
        return inputs_from_args(["--config", f.name], gpu_memory)
    finally:
        Path(f.name).unlink()


def plan_main(args: list[str]) -> int:
    """``lit-agentrl plan``: print the plan of the run ``lit-agentrl fit ARGS`` would start, from fit's own arguments
    (``--config FILE``, ``--KEY VALUE``) beside the plan's; 0 when it fits, 1 when not."""
    parser = argparse.ArgumentParser(
        prog="lit-agentrl plan",
        description="Estimate a run's memory per GPU.",
        epilog="Every other argument is fit's, parsed as fit parses it: --config FILE, --KEY VALUE "
        "(e.g. --model.model_path PATH).",
        allow_abbrev=False,  # `--dev` must not stand for --devices: fit's keys pass through unabbreviated
    )
    parser.add_argument("--gpu-memory-gb", type=float, default=80.0, help="memory of one GPU, in 10^9 bytes")
    parser.add_argument("--devices", type=int, help="override trainer.devices and the data-parallel size")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE", help="the same as --KEY VALUE")
    ns, fit_args = parser.parse_known_args(args)
    for item in ns.override:
        if "=" not in item:
            parser.error(f"--override {item!r}: expected KEY=VALUE")
    cli_args = [*fit_args, *(f"--{item}" for item in ns.override)]
    label = " ".join(_config_files(cli_args)) or "the command line"
    try:
        inputs = inputs_from_args(cli_args, int(ns.gpu_memory_gb * GB), ns.devices)
    except ValueError as exc:
        print(f"lit-agentrl plan: {label}: {exc}", file=sys.stderr)
        return 2
    plan = plan_memory(inputs)
    print(f"{label}: {inputs.num_params / 1e9:.2f}B parameters, {inputs.data_parallel_size} GPU(s), per GPU:")
    print(plan.table())
    fits = plan.fits
    if inputs.engine in REMOTE_ENGINES:  # generation on GPUs of its own: planned apart
        servers = plan_servers(inputs)
        count = f"{servers.servers} rollout server(s)" if servers.servers else "each rollout server"
        print(f"\n{count}, tensor-parallel size {inputs.engine_tp_size}, per GPU:")
        print(servers.table())
        fits = fits and servers.fits
    sys.stdout.flush()
    return 0 if fits else 1


def _config_files(args: list[str]) -> list[str]:
    """The files of ``--config FILE`` / ``--config=FILE`` / ``-c FILE`` among fit's arguments."""
    files = []
    for i, arg in enumerate(args):
        if arg.startswith("--config="):
            files.append(arg.split("=", 1)[1])
        elif arg in ("--config", "-c") and i + 1 < len(args):
            files.append(args[i + 1])
    return files


# ---------------------------------------------------------------------------------------------- errors


def find_user_error(exc: BaseException) -> UserInputError | None:
    """The :class:`UserInputError` behind ``exc``: itself, one it was raised from (or while handling), or one a
    spawned process raised (torch.multiprocessing passes it on as the text of its traceback)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, UserInputError):
            return current
        seen.add(id(current))
        if type(current).__name__ == "ProcessRaisedException":
            match = re.search(r"UserInputError: (.*)\Z", str(current).rstrip(), re.DOTALL)
            return UserInputError(match.group(1)) if match else None
        current = current.__cause__ or current.__context__
    return None


def _print_user_error(error: UserInputError) -> None:
    print(f"lit-agentrl: error: {error.message}", file=sys.stderr)
    if error.hint:
        print(f"hint: {error.hint}", file=sys.stderr)
    print(f"({TRACEBACK_ENV}=1 shows the traceback)", file=sys.stderr)


def main(args: list[str] | None = None) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    argv = sys.argv[1:] if args is None else args
    try:
        if argv[:1] == ["plan"]:  # memory estimate from the config alone, before LightningCLI (see lit_agentrl.plan)
            raise SystemExit(plan_main(argv[1:]))
        if argv[:1] == ["view"]:  # a run's trajectory log as one HTML page (see lit_agentrl.viewer)
            from lit_agentrl.viewer.cli import view_main

            raise SystemExit(view_main(argv[1:]))
        if argv[:1] == ["pool"]:  # a rollout pool on GPUs of its own (see lit_agentrl.engines.rollout_pool)
            from lit_agentrl.engines.rollout_pool import pool_main

            raise SystemExit(pool_main(argv[1:]))
        refuse_renamed_keys(argv)
        build_cli(args)
    except Exception as exc:
        error = find_user_error(exc)
        if error is None or os.environ.get(TRACEBACK_ENV, "") not in ("", "0"):
            raise
        _print_user_error(error)
        raise SystemExit(EXIT_USER_ERROR) from None


if __name__ == "__main__":
    main()
