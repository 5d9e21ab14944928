"""GRPOModule: the policy, sharded with FSDP2 under ModelParallelStrategy, and the GRPO update.

``training_step`` consumes the trajectories that :class:`~lit_agentrl.callbacks.RolloutCallback` attached
to the batch: group-normalised advantages, token log-probs over micro-batches sized by a token budget,
the clipped surrogate (optionally with KL to a frozen reference), and one optimizer step per mini-batch.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.core.optimizer import LightningOptimizer
from torch.optim.lr_scheduler import LRScheduler
from torchmetrics import MeanMetric
from transformers import PreTrainedModel

from lit_agentrl.config.training import Compute, Correction, Lora, Loss, Optimizer, Overlong
from lit_agentrl.errors import UserInputError
from lit_agentrl.models.lora_names import is_adapter
from lit_agentrl.models.processors import vision_settings
from lit_agentrl.models.skeleton import empty_model
from lit_agentrl.training.advantage_estimators import Episode
from lit_agentrl.training.batching import (
    MicroBatch,
    TrainingSample,
    collate,
    plan_micro_batches,
    prepare_samples,
    split_mini_batches,
)
from lit_agentrl.training.critic import ValueHead, fit_critic, turn_start_states
from lit_agentrl.training.loading import fully_shard_layers, load_pretrained, materialize_sharded
from lit_agentrl.training.logprobs import check_chunked_head, model_token_logprobs
from lit_agentrl.training.lora import adapters_disabled, add_adapters
from lit_agentrl.training.losses import LossScale, TokenLogProbs
from lit_agentrl.training.lr_schedule import lr_factor
from lit_agentrl.training.objective import loss_scale, micro_batch_loss
from lit_agentrl.training.policy_checks import check_data_parallel_mesh, check_packing_support
from lit_agentrl.training.turn_advantages import EpisodePool
from lit_agentrl.types import PromptBatch

# Lightning 2.6 warns that ModelCheckpoint(every_n_train_steps) under manual optimization saves the state after the
# optimizer step. That is the state a resume needs: the checkpoint after step N holds N optimizer steps
# (tests/reliability/test_crash_resume.py resumes it bit for bit).
warnings.filterwarnings("ignore", message="Using ModelCheckpoint with manual optimization and every_n_train_steps")


class GRPOModule(L.LightningModule):
    """Group Relative Policy Optimization of a causal LM loaded from a local path.

    Args:
        model_path: local directory of a Hugging Face causal LM (weights, config, tokenizer).
        optimizer: AdamW, its schedule and its steps (``lit_agentrl.config.training.Optimizer``).
        loss: the GRPO loss (``lit_agentrl.config.training.Loss``).
        correction: importance weights between the engine and the trainer (None: off;
            ``lit_agentrl.config.training.Correction``); needs ``loss.old_logprobs: trainer``.
        overlong: what trajectories cut by the length limit get (``lit_agentrl.config.training.Overlong``).
        compute: memory against time (``lit_agentrl.config.training.Compute``).
        lora: low-rank adapters on a frozen base (``lit_agentrl.config.training.Lora``; off unless ``rank`` is set):
            only the adapters are trained, and the KL term's reference is the base with the adapters disabled.

    Log-probs are computed at the temperature each rollout was sampled at (``RolloutBatch.temperature``, the
    rollout callback's ``train.sampling_params.temperature``): there is one temperature, the sampler's.
    """

    def __init__(
        self,
        model_path: str,
        optimizer: Optimizer = Optimizer(),
        loss: Loss = Loss(),
        correction: Correction | None = None,
        overlong: Overlong = Overlong(),
        compute: Compute = Compute(),
        lora: Lora = Lora(),
    ) -> None:
        super().__init__()
        if correction is not None and loss.old_logprobs != "trainer":
            raise UserInputError(
                "model.correction corrects the trainer's old log-probs towards the engine's: it needs "
                "model.loss.old_logprobs: trainer"
            )
        self.model_path = model_path
        self.optimizer, self.loss, self.correction = optimizer, loss, correction
        self.overlong, self.compute, self.lora = overlong, compute, lora
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.model: PreTrainedModel | None = None
        self.reference: PreTrainedModel | None = None
        self.skipped_steps = 0
        self.critic: ValueHead | None = None  # gae's, made with the policy in configure_model
        self.critic_optimizer: torch.optim.Optimizer | None = None
        self._critic_features: torch.Tensor | None = None
        self._critic_seconds = 0.0
        self.val_accuracy = MeanMetric()
        self.val_reward = MeanMetric()

    # ------------------------------------------------------------------ model and optimizer

    def configure_model(self) -> None:
        if self.model is not None:
            return
        lora = self.lora if self.lora.enabled else None
        copies = 2 if self.loss.needs_reference and lora is None else 1  # LoRA's reference: the base itself
        if self.device_mesh is None and self.compute.param_dtype != "float32":
            raise UserInputError(
                f"model.compute.param_dtype={self.compute.param_dtype} is FSDP2's mixed precision, and this run has no device "
                "mesh: set trainer.strategy to lightning.pytorch.strategies.ModelParallelStrategy (data_parallel_size: "
                "1 for one device) or model.compute.param_dtype: float32"
            )
        with_adapters = (lambda model: add_adapters(model, lora)) if lora is not None else None
        if self.device_mesh is None:
            models = [load_pretrained(self.model_path) for _ in range(copies)]
            if with_adapters is not None:
                with_adapters(models[0])
            self._prepare(models)
        else:
            # Sharded before any weight is allocated; rank 0 alone reads the checkpoint (see loading.py).
            check_data_parallel_mesh(self.device_mesh)
            models = [empty_model(self.model_path) for _ in range(copies)]
            if with_adapters is not None:
                with_adapters(models[0])
            self._prepare(models)
            for model in models:
                fully_shard_layers(model, self.device_mesh["data_parallel"], self.compute.param_dtype)
            materialize_sharded(models, self.model_path, self.device, with_adapters)
        self.model = models[0].train()
        if copies == 2:
            self.reference = models[1].requires_grad_(False).eval()
        # Under bf16 the same logits computed two ways differ by rounding (~1e-2); a real fault differs by O(1).
        tolerance = 1e-3 if self.compute.param_dtype == "float32" and lora is None else 3e-2
        if self.compute.sequence_packing:
            check_packing_support(self.model, tolerance)
        check_chunked_head(self.model, self.compute.logprob_chunk_tokens, tolerance)
        if self.loss.advantage == "gae":
            self.critic = ValueHead(self.model.config.get_text_config().hidden_size).to(self.device)
            self.critic_optimizer = torch.optim.AdamW(self.critic.parameters(), lr=self.loss.critic_lr)

    def _prepare(self, models: list[PreTrainedModel]) -> None:
        if self.compute.gradient_checkpointing:
            models[0].gradient_checkpointing_enable()
            models[0].config.use_cache = False
            # A frozen embedding would leave reentrant checkpoints without a graph to the adapters.
            if self.lora.enabled:
                models[0].enable_input_require_grads()

    @property
    def policy(self) -> PreTrainedModel:
        """The policy being trained (loaded by ``configure_model``)."""
        if self.model is None:
            raise RuntimeError("the policy is loaded in configure_model(); call it (the Trainer does) first")
        return self.model

    def configure_optimizers(self) -> Any:
        u = self.optimizer
        trained = [p for p in self.policy.parameters() if p.requires_grad]  # with LoRA, the adapters alone
        optimizer = torch.optim.AdamW(trained, lr=u.lr, betas=u.betas, weight_decay=u.weight_decay)
        factor = lr_factor(u.lr_schedule, u.warmup_steps, max(1, self._total_optimizer_steps()))
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def _total_optimizer_steps(self) -> int:
        if self.trainer.max_steps and self.trainer.max_steps > 0:
            return self.trainer.max_steps
        return int(self.trainer.estimated_stepping_batches) * self.optimizer.mini_batches

    def _optimizer_and_scheduler(self) -> tuple[LightningOptimizer, LRScheduler]:
        optimizer, scheduler = self.optimizers(), self.lr_schedulers()
        assert isinstance(optimizer, LightningOptimizer) and isinstance(scheduler, LRScheduler)
        return optimizer, scheduler

    # ------------------------------------------------------------------ training

    def training_step(self, batch: PromptBatch, batch_idx: int) -> None:
        if batch.rollout is None:
            raise RuntimeError(
                "the batch has no rollout: add lit_agentrl.callbacks.RolloutCallback to trainer.callbacks"
            )
        start = time.perf_counter()
        temperature = batch.rollout.temperature  # the sampler's: log-probs are of the distribution it sampled
        engine_logprobs_needed = self.loss.old_logprobs == "engine" or self.correction is not None
        prepared = prepare_samples(
            batch.rollout.trajectories,
            self.loss.advantage_std,
            engine_logprobs_needed,
            self.overlong,
            self.loss.sequence_rewards,
            advantage=self.loss.advantage,
            gamma=self.loss.discount,
            step_weight=self.loss.omega,
            step_groups=self.loss.step_groups,
            lam=self.loss.lam,
            step_first_turn=self.loss.first_turn_steps,
            vision=vision_settings(self.policy),
            pool=self._episode_pool() if self.loss.step_groups == "batch" or self.critic is not None else None,
            turn_values=self._turn_values if self.critic is not None else None,
        )
        critic_stats = self._fit_critic(prepared.value_targets) if self.critic is not None else {}
        stats: dict[str, list[float]] = {}
        if self.loss.old_logprobs == "trainer" and not self.old_logprobs_from_update:
            stats["time/old_logprobs_s"] = [self.recompute_old_logprobs(prepared.samples, temperature)]
        for part in split_mini_batches(prepared.samples, self.optimizer.mini_batches):
            for key, value in self._optimizer_step(part, temperature).items():
                stats.setdefault(key, []).append(value)
        # Timings add up over the mini-batches, maxima are maxima; the other statistics are their means.
        logged = {key: _combine(key, v) for key, v in stats.items()}
        maxima = {key: logged.pop(key) for key in list(logged) if key.endswith("_max")}
        logged["train/filtered_groups"] = float(prepared.num_flat_groups)
        logged |= prepared.turn_metrics | critic_stats
        logged["train/skipped_steps"] = float(self.skipped_steps)
        logged["train/lr"] = float(self._optimizer_and_scheduler()[1].get_last_lr()[0])
        self.log_dict(logged, on_step=True, sync_dist=True, batch_size=max(1, len(prepared.samples)))
        if maxima:
            self.log_dict(maxima, on_step=True, sync_dist=True, reduce_fx="max", batch_size=1)
        self.log("time/train_s", time.perf_counter() - start, on_step=True, prog_bar=True, batch_size=1)

    def _optimizer_step(self, samples: list[TrainingSample], temperature: float) -> dict[str, float]:
        """Accumulate the mini-batch's gradients, then clip and step (or skip the step if they are not finite)."""
        optimizer, scheduler = self._optimizer_and_scheduler()
        optimizer.zero_grad(set_to_none=True)
        result = self.accumulate_gradients(samples, self.manual_backward, temperature)
        start = self._clock()
        grad_norm = self._clip_gradients()
        if math.isfinite(grad_norm):
            optimizer.step()
            scheduler.step()
        else:
            self.skipped_steps += 1
        optimizer.zero_grad(set_to_none=True)
        result["time/optimizer_s"] = self._clock() - start
        result["train/grad_norm"] = grad_norm
        return result

    def accumulate_gradients(
        self,
        samples: list[TrainingSample],
        backward: Callable[[torch.Tensor], Any] = torch.Tensor.backward,
        temperature: float = 1.0,
    ) -> dict[str, float]:
        """Forward and backward over the micro-batches of one mini-batch; returns its statistics.

        The gradients add up to those of one forward over the whole mini-batch (the loss is scaled by the
        mini-batch's counts over every data-parallel rank). Needs no Trainer: ``backward`` is ``manual_backward``
        inside a fit. ``temperature``: the one the samples were drawn at.
        """
        scale = self._data_parallel_scale(samples)
        plans = plan_micro_batches(samples, self.compute.micro_batch_tokens, self.compute.sequence_packing)
        sums: dict[str, float] = {"time/forward_s": 0.0, "time/backward_s": 0.0}
        maxima: dict[str, float] = {}
        # Every rank must run as many forward/backward passes as the busiest one (FSDP collectives).
        for i in range(self._max_across_ranks(len(plans))):
            start = self._clock()
            if i < len(plans):
                rows = [[samples[j] for j in row] for row in plans[i]]
                micro = collate(rows, self._pad_id(), self.device, vision_settings(self.policy))
                loss, micro_stats = self._micro_loss(micro, scale, temperature)
            else:
                loss, micro_stats = self._dummy_loss(), {}
            middle = self._clock()
            backward(loss)
            micro_stats["time/forward_s"], micro_stats["time/backward_s"] = middle - start, self._clock() - middle
            for key, value in micro_stats.items():
                if key.endswith("_max"):
                    maxima[key] = max(maxima.get(key, value), value)
                else:
                    sums[key] = sums.get(key, 0.0) + value
        # Token-weighted means of the per-token stats; the loss is already normalised by the mini-batch's counts.
        result = {key: value / scale.tokens for key, value in sums.items() if key.startswith("train/")}
        result.update(maxima)
        result.update({key: value for key, value in sums.items() if key.startswith("time/")})
        result["train/loss"] = sums.get("train/loss", 0.0)
        return result

    @property
    def old_logprobs_from_update(self) -> bool:
        """Whether the trainer's old log-probs come from the update's own forward instead of a forward before it.

        With one mini-batch the step makes one optimizer update, after every forward: the policy before the
        update is the policy of those forwards, so their detached log-probs are pi_old exactly (verl's actor does
        the same with one mini-batch and one epoch) and the recomputing forward would repeat them.
        """
        return self.loss.old_logprobs == "trainer" and self.optimizer.mini_batches == 1

    @torch.no_grad()
    def recompute_old_logprobs(self, samples: list[TrainingSample], temperature: float = 1.0) -> float:
        """Replace every sample's ``old_logprobs`` with the policy's own, before any update of this step (the
        same micro-batches and packing as the update, so on-policy ratios start at exactly 1); returns seconds."""
        start = self._clock()
        for order, micro in self._no_grad_micro_batches(samples):
            logprobs = self._token_logprobs(self.policy, micro, temperature, with_entropy=False).logprobs.float().cpu()
            index = micro.sequence_index.cpu()
            for k, j in enumerate(order):
                samples[j].old_logprobs = logprobs[index == k].tolist()
        return self._clock() - start

    def _no_grad_micro_batches(self, samples: list[TrainingSample]) -> Iterator[tuple[list[int], MicroBatch]]:
        """The update's micro-batches of ``samples`` (same plan and packing), each with the sample indices of its
        sequences in order, for a forward without gradients; every rank joins as many forwards as the busiest (a
        rank out of work runs the dummy pass, FSDP's collectives)."""
        plans = plan_micro_batches(samples, self.compute.micro_batch_tokens, self.compute.sequence_packing)
        for i in range(self._max_across_ranks(len(plans))):
            if i >= len(plans):
                with torch.no_grad():
                    self._dummy_loss()
                continue
            rows = [[samples[j] for j in row] for row in plans[i]]
            micro = collate(rows, self._pad_id(), self.device, vision_settings(self.policy))
            yield [j for row in plans[i] for j in row], micro

    @torch.no_grad()
    def _turn_values(self, samples: list[TrainingSample]) -> list[list[float]]:
        """The critic's V of each model turn of each sample (before this step's update), from the policy's hidden
        state at the position predicting the turn's first token; keeps those states for :meth:`_fit_critic`."""
        assert self.critic is not None
        start = self._clock()
        empty = torch.zeros(0, self.critic.hidden_size, device=self.device)
        masks = [sample.loss_mask for sample in samples]
        states = turn_start_states(self.policy, self._no_grad_micro_batches(samples), masks, empty)
        self._critic_features = torch.cat([empty, *states])  # ``empty`` first: a rank with no samples has none
        values = self.critic(self._critic_features).tolist()
        self._critic_seconds = self._clock() - start
        ends = itertools.accumulate(len(s) for s in states)
        return [values[end - len(s) : end] for s, end in zip(states, ends)]

    def _fit_critic(self, targets: list[list[float]]) -> dict[str, float]:
        """Regress the critic on this step's lambda-returns from the states :meth:`_turn_values` kept (none kept:
        no trajectory of this step succeeded, on one process)."""
        assert self.critic is not None and self.critic_optimizer is not None
        if self._critic_features is None:
            return {}
        start = self._clock()
        flat = torch.tensor([g for turns in targets for g in turns], dtype=torch.float32, device=self.device)
        with torch.enable_grad():
            stats = fit_critic(
                self.critic, self.critic_optimizer, self._critic_features, flat, self._data_parallel_group()
            )
        self._critic_features = None
        return stats | {"time/critic_s": self._critic_seconds + self._clock() - start}

    def _micro_loss(
        self, micro: MicroBatch, scale: LossScale, temperature: float
    ) -> tuple[torch.Tensor, dict[str, float]]:
        policy = self._token_logprobs(self.policy, micro, temperature, with_entropy=True)
        if self.old_logprobs_from_update:
            micro = micro._replace(old_logprobs=policy.logprobs.detach().to(micro.old_logprobs.dtype))
        reference = None
        if self.loss.needs_reference:
            with torch.no_grad(), self._reference() as model:
                reference = self._token_logprobs(model, micro, temperature, with_entropy=False).logprobs
        return micro_batch_loss(self.loss, self.correction, micro, policy, scale, reference)

    @contextlib.contextmanager
    def _reference(self) -> Iterator[PreTrainedModel]:
        """The KL term's reference policy: the frozen copy, or with LoRA the policy's base, adapters disabled."""
        if self.reference is not None:
            yield self.reference
            return
        with adapters_disabled(self.policy):
            yield self.policy

    def _token_logprobs(
        self, model: PreTrainedModel, micro: MicroBatch, temperature: float, with_entropy: bool
    ) -> TokenLogProbs:
        return model_token_logprobs(
            model,
            micro.model_inputs(),
            micro.targets,
            micro.loss_mask > 0,
            temperature,
            self.compute.logprob_chunk_tokens,
            with_entropy=with_entropy,
            entropy_grad=self.loss.entropy_coef > 0,
        )

    def _dummy_loss(self) -> torch.Tensor:
        """A zero loss through the whole model, so a rank with no work still joins FSDP's collectives."""
        ids = torch.full((1, 1), self._pad_id(), dtype=torch.long, device=self.device)
        logits = self.policy(input_ids=ids, use_cache=False).logits
        if self.loss.needs_reference:
            with torch.no_grad(), self._reference() as model:
                model(input_ids=ids, use_cache=False)
        return logits.sum() * 0.0

    def _clip_gradients(self) -> float:
        max_norm = self.optimizer.grad_clip if self.optimizer.grad_clip is not None else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), max_norm)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        return float(norm)

    def _clock(self) -> float:
        """Wall time after the device's queued work is done, so per-phase timings are honest on GPUs."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _data_parallel_scale(self, samples: list[TrainingSample]) -> LossScale:
        """The loss scale that makes the update the same on 1 or N data-parallel ranks.

        FSDP averages the ranks' gradients, so each rank divides its loss by the global batch's token (or
        sequence) count over the number of ranks: the average is then the global batch's loss, however unequally
        the ranks' shares are sized. One process: the mini-batch's own counts.
        """
        group = self._data_parallel_group()
        if group is None:
            return loss_scale(samples, self.loss.scale_length)
        ranks = dist.get_world_size(group)
        counts = torch.tensor([sum(sum(s.loss_mask) for s in samples), len(samples)], dtype=torch.float64)
        counts = counts.to(self.device)
        dist.all_reduce(counts, group=group)
        tokens, sequences = (max(float(c), 1.0) / ranks for c in counts.tolist())
        return LossScale(tokens=tokens, sequences=sequences, norm_length=self.loss.scale_length)

    def _data_parallel_group(self) -> dist.ProcessGroup | None:
        """The policy mesh's data-parallel process group; None without a mesh or a process group."""
        if self.device_mesh is None or not dist.is_initialized():
            return None
        return self.device_mesh["data_parallel"].get_group()

    def _episode_pool(self) -> EpisodePool | None:
        """Gathers the data-parallel ranks' episodes, so step groups span the whole batch; None on one rank."""
        group = self._data_parallel_group()
        ranks = dist.get_world_size(group) if group is not None else 1
        if ranks == 1:
            return None

        def pool(episodes: list[Episode]) -> tuple[list[list[Episode]], int]:
            gathered: list[Any] = [None] * ranks
            dist.all_gather_object(gathered, episodes, group=group)
            return gathered, dist.get_rank(group)

        return pool

    def _max_across_ranks(self, value: int) -> int:
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return value
        tensor = torch.tensor([value], device=self.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return int(tensor.item())

    def _pad_id(self) -> int:
        config = self.policy.config
        pad = config.pad_token_id if config.pad_token_id is not None else config.eos_token_id
        return int(pad[0] if isinstance(pad, list) else pad or 0)

    # ------------------------------------------------------------------ validation

    def validation_step(self, batch: PromptBatch, batch_idx: int) -> None:
        if batch.rollout is None:
            raise RuntimeError(
                "the batch has no rollout: add lit_agentrl.callbacks.RolloutCallback to trainer.callbacks"
            )
        ok = [t for t in batch.rollout.trajectories if not t.failed]
        rewards = torch.tensor([t.reward for t in batch.rollout.trajectories], dtype=torch.float32)
        # A failed trajectory counts as a wrong answer: accuracy is over every attempt.
        solved = torch.tensor([float(not t.failed and t.reward >= 1.0) for t in batch.rollout.trajectories])
        if len(rewards):
            self.val_accuracy.update(solved)
            self.val_reward.update(rewards if ok else torch.zeros_like(rewards))
        self.log("val/accuracy", self.val_accuracy, on_epoch=True, prog_bar=True, batch_size=len(rewards))
        self.log("val/reward_mean", self.val_reward, on_epoch=True, batch_size=len(rewards))

    # ------------------------------------------------------------------ checkpoint

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        """With LoRA, the adapters alone (the frozen base is ``model_path``'s, loaded again on resume): Lightning's
        checkpoints, sharded or not, hold them and their optimizer state only."""
        state = super().state_dict(*args, **kwargs)
        if self.lora.enabled and self.model is not None:
            prefix = kwargs.get("prefix", "")
            for key in self._frozen_keys(prefix):
                state.pop(key, None)
        return state

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """With LoRA, a checkpoint of the adapters: every trained tensor must be there (the base is not)."""
        if not (self.lora.enabled and self.model is not None):
            return super().load_state_dict(state_dict, strict=strict, assign=assign)
        result = super().load_state_dict(state_dict, strict=False, assign=assign)
        missing = sorted(set(result.missing_keys) - set(self._frozen_keys()))
        if strict and (missing or result.unexpected_keys):
            raise RuntimeError(
                f"the checkpoint does not fit this LoRA policy (model.lora: rank {self.lora.rank}, target_modules "
                f"{self.lora.target_modules!r}): missing {missing[:4]}, unexpected {result.unexpected_keys[:4]}"
            )
        return result

    def _frozen_keys(self, prefix: str = "") -> list[str]:
        """The policy's state-dict keys that are not adapters (tied aliases such as ``lm_head.weight`` included)."""
        return [f"{prefix}model.{name}" for name in self.policy.state_dict(keep_vars=True) if not is_adapter(name)]

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["grpo_skipped_steps"] = self.skipped_steps
        if self.critic_optimizer is not None:  # the critic's weights are in the state dict; its AdamW is not
            checkpoint["critic_optimizer"] = self.critic_optimizer.state_dict()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.skipped_steps = int(checkpoint.get("grpo_skipped_steps", 0))
        if self.critic_optimizer is not None and "critic_optimizer" in checkpoint:
            self.critic_optimizer.load_state_dict(checkpoint["critic_optimizer"])


def _combine(key: str, values: list[float]) -> float:
    """One step's figure from its mini-batches' figures: timings add up, maxima are maxima, the rest averages."""
    if key.startswith("time/"):
        return sum(values)
    return max(values) if key.endswith("_max") else sum(values) / len(values)
