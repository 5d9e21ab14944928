"""Test-only callbacks that record what a fit did, for runs in this process or in launched subprocesses."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from lit_agentrl.bridge.weights import full_named_parameters


class PromptRecorder(Callback):
    """Append one JSON line per training step and rank: the step and the prompts the rank trained on."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        record = {
            "rank": trainer.global_rank,
            "step": trainer.global_step,
            "prompts": [r["prompt"][-1]["content"] for r in batch.rows],
        }
        record["epoch"], record["index"] = batch.epoch, batch.index
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")


class PauseEachStep(Callback):
    """Hold each training step for ``seconds`` after it starts: a window of known length, with the next step's rollout
    in flight, for a test that must act inside a given step whatever the machine's speed."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        time.sleep(self.seconds)


class SyncChecker(Callback):
    """After each step's weight sync, compare every engine weight with the gathered policy weight."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        rollout = next(c for c in trainer.callbacks if type(c).__name__ == "RolloutCallback")
        mismatched = [
            name
            for name, full in full_named_parameters(pl_module.model)
            if not torch.equal(rollout.engines[0].get_weights_by_name(name), full.to(torch.float32))
        ]
        sharded = any(hasattr(p, "full_tensor") for p in pl_module.model.parameters())
        record = {
            "rank": trainer.global_rank,
            "step": trainer.global_step,
            "mismatched": mismatched,
            "sharded": sharded,
        }
        with open(Path(self.path), "a") as f:
            f.write(json.dumps(record) + "\n")


class PoisonReward(Callback):
    """Turn one trajectory's reward into NaN in the listed batches: the loss, and so the gradient, go non-finite."""

    def __init__(self, batches: list[int]) -> None:
        self.batches = set(batches)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if batch_idx in self.batches:
            batch.rollout.trajectories[0].reward = float("nan")


class WeightWatcher(Callback):
    """Record, after every step, whether the weights changed and are finite."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._before: dict[str, torch.Tensor] = {}

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._before = {k: v.detach().clone() for k, v in pl_module.model.state_dict().items()}

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        after = pl_module.model.state_dict()
        record = {
            "batch": batch_idx,
            "changed": any(not torch.equal(self._before[k], v) for k, v in after.items()),
            "finite": all(bool(torch.isfinite(v).all()) for v in after.values()),
        }
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")


class GreedyAgreement(Callback):
    """After each step's weight sync, compare the engine's greedy tokens with the policy's own ``generate``."""

    def __init__(self, path: str, prompt: list[int], new_tokens: int = 6) -> None:
        self.path, self.prompt, self.new_tokens = path, prompt, new_tokens

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        import asyncio

        rollout = next(c for c in trainer.callbacks if type(c).__name__ == "RolloutCallback")
        engine = rollout.engines[0]
        params = {"temperature": 0.0, "max_new_tokens": self.new_tokens, "ignore_eos": True}
        request = engine.async_generate(input_ids=self.prompt, sampling_params=params)
        loop = engine.loop
        result = (
            loop.run_until_complete(request)
            if loop is not None
            else asyncio.new_event_loop().run_until_complete(request)
        )
        with torch.no_grad():
            policy = pl_module.model.generate(
                torch.tensor([self.prompt]), max_new_tokens=self.new_tokens, do_sample=False, eos_token_id=None
            )[0, len(self.prompt) :].tolist()
        with open(self.path, "a") as f:
            adapter = getattr(engine, "adapter_name", None)  # SGLang's, with model.lora.sync: adapter
            record = {"step": trainer.global_step, "engine": result["output_ids"], "policy": policy, "adapter": adapter}
            f.write(json.dumps(record) + "\n")
