"""``lit-agentrl plan --config X.yaml``: will a run fit in GPU memory? Estimates per GPU, from the config alone.

Reads the run config and the model's ``config.json`` (the model is built on the meta device: no weights are
read), then models what the code does *today*:

* FSDP2 over ``data_parallel_size`` ranks: fp32 master parameters, fp32 gradients and AdamW's two fp32 states,
  each sharded 1/N. During forward/backward each decoder layer is all-gathered in ``param_dtype`` (the current
  layer and the prefetched next one), and its unsharded gradient (``param_dtype``, plus the fp32 copy that is
  reduce-scattered); the root group (embeddings, final norm, head) stays unsharded from the start of forward
  to the end of backward (FSDP2 does not reshard the root after forward), and so does its unsharded gradient.
  ``kl_coef > 0`` adds a frozen fp32 reference, sharded the same way, and its logits.
* Activations per micro-batch of ``micro_batch_tokens`` tokens: see :func:`layer_activation_bytes_per_token`.
* The log-probs (``lit_agentrl.training.logprobs``). Chunked (``logprob_chunk_tokens > 0``, the default): one chunk's
  logits in ``param_dtype``, their fp32 upcast, the entropy's two fp32 temporaries, and in backward's
  recomputation the logits' fp32 and ``param_dtype`` gradients; nothing [tokens, vocab] is kept. Full
  (``logprob_chunk_tokens: 0``): logits for every token in ``param_dtype``, their fp32 upcast (kept for the
  backward of ``logsumexp``), and two more [tokens, vocab] fp32 temporaries.
* SGLang on the same GPU (``colocate``): weights in its dtype, and a KV cache of
  ``mem_fraction_static x GPU memory - weights``; released during training when ``enable_memory_saver``.
* The trainer's CUDA caching allocator: in colocated mode ``RolloutCallback`` empties it before SGLang resumes
  (``torch.cuda.empty_cache()``), so only the sharded states stay; otherwise the memory reserved at the training
  peak stays reserved beside SGLang's (``PlanInputs.trainer_cache_released``). With ``engine.offload_trainer`` (on by
  default in colocated mode) the sharded parameters and AdamW states leave the GPU while SGLang generates
  (``lit_agentrl.rollout.colocation``): the AdamW states before the weight sync, the parameters after it.
* Host memory at load: under FSDP2 (more than one rank) rank 0 alone reads one fp32 copy on the CPU and broadcasts
  it, each rank keeping its shards (``lit_agentrl.training.loading``); one process loads each model whole (twice with a
  reference).

Not modelled: SGLang's memory outside ``mem_fraction_static`` (CUDA graphs, its activations), NCCL buffers, the
CUDA context (~0.5-1 GB per process), fragmentation. GB here are 10^9 bytes. The figures are estimates, checked
on CPU against real tensors (tests/test_plan.py), not on a GPU.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lit_agentrl.models.dtypes import dtype_bytes

GB = 10**9
SGLANG_DEFAULT_MEM_FRACTION = 0.88  # what SGLang picks on large (80 GB-class) GPUs when none is given
COLOCATED_ENGINES = ("sglang",)
REMOTE_ENGINES = ("sglang_http", "sglang_router")
"""Engines whose servers run on GPUs of their own: planned apart (:mod:`lit_agentrl.plan_servers`)."""


@dataclass(frozen=True)
class ModelShapes:
    """The model's sizes, read from its config on the meta device (:func:`model_shapes`)."""

    num_params: int  # unique parameters (tied embeddings counted once)
    layer_params: int  # parameters of the largest decoder layer
    root_params: int  # parameters outside the decoder layers: embeddings, final norm, head (FSDP2's root group)
    hidden_size: int
    num_layers: int
    vocab_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int


@dataclass(frozen=True)
class PlanInputs(ModelShapes):
    """Plain numbers a memory plan is computed from: the model's shapes, then the run's settings from the config."""

    param_dtype: str = "float32"  # model.param_dtype: the compute / all-gather dtype
    engine_dtype: str = "bfloat16"  # engine.kwargs.dtype
    engine_tp_size: int = 1  # engine.kwargs.tp_size
    data_parallel_size: int = 1
    gpu_memory: int = 80 * GB
    micro_batch_tokens: int = 16384
    logprob_chunk_tokens: int = 1024  # 0: full logits
    gradient_checkpointing: bool = False
    sequence_packing: bool = True
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    temperature: float = 1.0
    engine: str = "sglang"
    colocate: bool = False
    mem_fraction_static: float | None = None
    enable_memory_saver: bool = False
    prompts_per_step: int = 8
    n_samples: int = 8
    max_prompt_length: int = 0
    max_new_tokens: int = 128
    ranks_per_node: int = 1
    trainer_cache_released: bool = False  # torch.cuda.empty_cache() runs before each rollout (colocated mode)
    trainer_offloaded: bool = False  # parameters and AdamW states in host memory while SGLang generates
    sync_bucket_mb: int = 512
    max_steps: int = -1  # trainer.max_steps (-1: unbounded)
    checkpoint_every_n_steps: int | None = None  # ModelCheckpoint.every_n_train_steps (None: no checkpoints)
    checkpoints_kept: int = -1  # ModelCheckpoint.save_top_k (-1: every one)
    lora_rank: int = 0  # model.lora.rank (0: full fine-tuning)
    lora_params: int = 0  # the adapters' parameters, all layers (lora_parameters)
    lora_base_dtype: str = "bfloat16"  # model.lora.base_dtype: the frozen base's dtype
    lora_sync: str = "merged"  # model.lora.sync
    rollout_servers: int = 0  # a remote engine's engine.kwargs.urls (0: not listed)
    rollouts_ahead: int = 0  # async_rollouts.ahead


@dataclass
class MemoryPlan:
    """Per-GPU byte figures, phase peaks and the verdict."""

    figures: dict[str, int]  # name -> bytes per GPU (or per rank/node for host memory, as named)
    phases: dict[str, int]  # phase -> peak bytes per GPU
    kv_bytes_per_token: int
    kv_capacity_tokens: int
    worst_case_tokens: int
    gpu_memory: int
    fits: bool
    reasons: list[str] = field(default_factory=list)  # why it does not fit, first the first phase that fails
    warnings: list[str] = field(default_factory=list)

    def table(self) -> str:
        """One row per figure and per phase, GB per GPU; then the KV capacity and the verdict."""
        rows = [(name, f"{value / GB:10.2f} GB") for name, value in self.figures.items()]
        rows.append(("", ""))
        rows += [(f"peak: {phase}", f"{value / GB:10.2f} GB") for phase, value in self.phases.items()]
        rows.append(("GPU memory", f"{self.gpu_memory / GB:10.2f} GB"))
        if self.kv_capacity_tokens:  # an engine on these GPUs (a remote one's servers are planned apart)
            rows.append(("", ""))
            rows.append(("KV bytes per token", f"{self.kv_bytes_per_token:>13,d}"))
            rows.append(("KV capacity (tokens)", f"{self.kv_capacity_tokens:>13,d}"))
            rows.append(("worst case (tokens)", f"{self.worst_case_tokens:>13,d}"))
        width = max(len(name) for name, _ in rows)
        lines = [f"{name:<{width}}  {value}" if name else "" for name, value in rows]
        lines.append("")
        lines += [f"warning: {w}" for w in self.warnings]
        verdict = "FITS" if self.fits else "DOES NOT FIT"
        lines.append(f"verdict: {verdict}" + (f": {self.reasons[0]}" if self.reasons else ""))
        lines += [f"  also: {r}" for r in self.reasons[1:]]
        return "\n".join(lines)


def lora_parameters(model_path: str, lora: Any) -> int:
    """The adapters' parameters: r (in + out) per targeted linear layer, the targets found in the model built on the
    meta device as training finds them (:func:`~lit_agentrl.training.lora.target_module_names`, which refuses bad
    ones naming ``model.lora.target_modules``)."""
    from lit_agentrl.models.skeleton import empty_model
    from lit_agentrl.training.lora import target_module_names

    model = empty_model(model_path)
    modules = dict(model.named_modules())
    targets = target_module_names(model, lora)
    return sum(int(lora.rank) * (modules[n].in_features + modules[n].out_features) for n in targets)


def layer_activation_bytes_per_token(x: PlanInputs) -> int:
    """Bytes one Qwen3 decoder layer saves for backward, per token, without checkpointing.

    Counted from transformers' ``Qwen3DecoderLayer`` (sdpa attention) and PyTorch's autograd rules (a product
    saves only the factor the other operand's gradient needs), with b = bytes of ``param_dtype``, h hidden,
    q/kv query and key-value heads, d head_dim, i intermediate:

    * each of the two RMSNorms (over h): its fp32 input (4h), the normalised value cast back to b (b h) that the
      weight multiplies, and its output, which the next linear saves (b h): (4 + 2b) h, twice;
    * q_norm and k_norm (over d per head): fp32 input and normalised value, (4 + b) q d and (4 + b) kv d (their
      outputs go into RoPE, whose products with cos/sin save only cos/sin);
    * attention inputs after RoPE: b q d (queries) + 2 b kv' d (keys, values), where kv' = q when the keys and
      values are repeated to every head (packed rows: transformers then builds a mask, and sdpa's GQA path
      needs none), else kv;
    * sdpa's output and its log-sum-exp: b q d + 4 q; the transposed contiguous copy ``o_proj`` saves: b q d;
    * SwiGLU MLP: gate, silu(gate), up, and their product: 4 b i.
    """
    b = dtype_bytes(x.param_dtype)
    h, q, kv, d, i = x.hidden_size, x.num_heads, x.num_kv_heads, x.head_dim, x.intermediate_size
    kv_attn = q if x.sequence_packing else kv
    norms = 2 * (4 + 2 * b) * h
    qk_norms = (4 + b) * q * d + (4 + b) * kv * d
    attention = b * q * d + 2 * b * kv_attn * d + b * q * d + 4 * q + b * q * d
    mlp = 4 * b * i
    return norms + qk_norms + attention + mlp


def outside_layers_activation_bytes_per_token(x: PlanInputs) -> int:
    """Saved outside the decoder layers, per token: the final norm and the head's input ((4 + 2b) h), RoPE's cos
    and sin (2 b d), the input ids (8)."""
    b = dtype_bytes(x.param_dtype)
    return (4 + 2 * b) * x.hidden_size + 2 * b * x.head_dim + 8


def plan_memory(x: PlanInputs) -> MemoryPlan:
    """The memory plan of one GPU (every rank holds the same)."""
    n, p = x.data_parallel_size, x.num_params
    b = dtype_bytes(x.param_dtype)
    t, v = x.micro_batch_tokens, x.vocab_size
    reduce_copy = 4 if b < 4 else 0  # FSDP2 casts unsharded gradients to reduce_dtype=float32 to reduce-scatter
    # With LoRA the base is frozen in its own dtype (no gradients, no AdamW states), only the adapters (a) train in
    # fp32, and the KL's reference is the base itself (no copy).
    a = x.lora_params
    trained = a if a else p
    reference = x.kl_coef > 0 and not a
    f: dict[str, int] = {}
    if a:
        f["parameters (frozen base, sharded)"] = dtype_bytes(x.lora_base_dtype) * p // n
        f["adapters (fp32, sharded)"] = 4 * a // n
    else:
        f["parameters (fp32, sharded)"] = 4 * p // n
    f["gradients (fp32, sharded)"] = 4 * trained // n
    f["AdamW states (2 x fp32, sharded)"] = 8 * trained // n
    f["reference (fp32, sharded)"] = 4 * p // n if reference else 0
    f["root params gathered (embed+head)"] = x.root_params * b * (2 if reference else 1)
    f["root grads unsharded"] = 0 if a else x.root_params * b
    f["layer params gathered (2 layers)"] = 2 * (x.layer_params + a // x.num_layers) * b
    f["layer grads unsharded (1 layer)"] = (a // x.num_layers if a else x.layer_params) * (b + reduce_copy)
    per_layer = layer_activation_bytes_per_token(x)
    outside = outside_layers_activation_bytes_per_token(x)
    f["activations, no checkpointing"] = t * (x.num_layers * per_layer + outside)
    # HF checkpointing saves each layer's input (b h per token) and recomputes one layer at a time in backward.
    f["activations, checkpointing"] = t * (x.num_layers * b * x.hidden_size + per_layer + outside)
    f["packed attention mask (1 row)"] = t * t if x.sequence_packing else 0
    upcasts = 2 if x.temperature != 1.0 else 1
    if x.logprob_chunk_tokens > 0:
        chunk = min(x.logprob_chunk_tokens, t)
        f["logits (param dtype + fp32)"] = 0
        # The chunk's logits in b and their fp32 upcast (none when b is fp32 and the temperature 1), the entropy's
        # two fp32 temporaries, and in backward's recomputation the logits' fp32 gradient and its cast to b.
        upcast = 4 * upcasts if b < 4 else 4 * (upcasts - 1)
        f["log-prob chunk (logits, temporaries, grads)"] = chunk * v * (2 * b + upcast + 2 * 4 + 4)
        f["reference logits"] = 0
    else:
        f["logits (param dtype + fp32)"] = t * v * (b + 4 * upcasts)
        f["log-prob/entropy temporaries"] = 2 * t * v * 4
        f["reference logits"] = t * v * b if x.kl_coef > 0 else 0
    engine_on_gpu = x.engine in COLOCATED_ENGINES
    fraction = x.mem_fraction_static if x.mem_fraction_static is not None else SGLANG_DEFAULT_MEM_FRACTION
    engine_total = int(fraction * x.gpu_memory) if engine_on_gpu else 0
    # SGLang's tensor parallelism splits its weights over the engine's GPUs (roughly evenly: norms are replicated).
    engine_weights = p * dtype_bytes(x.engine_dtype) // x.engine_tp_size if engine_on_gpu else 0
    f["SGLang weights"] = engine_weights
    f["SGLang KV cache"] = engine_total - engine_weights
    # Per GPU: tensor parallelism splits the KV heads (replicating them past one head per GPU).
    kv_split = min(x.engine_tp_size, x.num_kv_heads)
    kv_per_token = 2 * x.num_layers * x.num_kv_heads * x.head_dim * dtype_bytes(x.engine_dtype) // kv_split
    kv_tokens = max(0, f["SGLang KV cache"]) // kv_per_token if engine_on_gpu else 0
    # One engine serves a group of tp_size ranks (one rank when the node holds one).
    ranks_per_engine = x.engine_tp_size if x.ranks_per_node > 1 else 1
    worst = x.prompts_per_step // n * ranks_per_engine * x.n_samples * (x.max_prompt_length + x.max_new_tokens)
    if n > 1:  # rank 0 reads one copy for the policy and the reference and broadcasts it (lit_agentrl.training.loading)
        f["host memory at load, rank 0"] = f["host memory at load, per node"] = 4 * p
    else:  # one process loads each model whole
        f["host memory at load, rank 0"] = f["host memory at load, per node"] = 4 * p * (2 if reference else 1)

    parameters = f.get("parameters (fp32, sharded)", 0) + f.get("parameters (frozen base, sharded)", 0)
    parameters += f.get("adapters (fp32, sharded)", 0)
    sharded = parameters + f["AdamW states (2 x fp32, sharded)"] + f["reference (fp32, sharded)"]
    activations = f["activations, checkpointing" if x.gradient_checkpointing else "activations, no checkpointing"]
    trainer_training = (
        sharded
        + f["gradients (fp32, sharded)"]
        + f["root params gathered (embed+head)"]
        + f["root grads unsharded"]
        + f["layer params gathered (2 layers)"]
        + f["layer grads unsharded (1 layer)"]
        + activations
        + f["packed attention mask (1 row)"]
        + f["logits (param dtype + fp32)"]
        + f.get("log-prob/entropy temporaries", 0)
        + f.get("log-prob chunk (logits, temporaries, grads)", 0)
        + f["reference logits"]
    )
    # AdamW (foreach) keeps about one more fp32 shard of temporaries during the step.
    trainer_optimizer = sharded + f["gradients (fp32, sharded)"] + 4 * trained // n
    released = x.colocate and x.enable_memory_saver
    engine_in_training = 0 if released else engine_total
    phases: dict[str, int] = {}
    # Between steps the gradients are freed (zero_grad(set_to_none=True)), but the caching allocator keeps what
    # the trainer reserved at its peak unless the cache is emptied.
    trainer_idle = sharded if x.trainer_cache_released else max(trainer_training, trainer_optimizer)
    # The weight sync (colocated: SGLang's weights resumed, its KV cache not yet; AdamW states already offloaded):
    # the sharded parameters, one bucket of tensors in the engine's dtype and its flattened copy, and the largest
    # tensor (embedding or head) as gathered in fp32 and cast, beside the bucket not yet sent
    # (lit_agentrl.bridge.weights).
    offloaded = x.colocate and x.trainer_offloaded
    engine_bytes = dtype_bytes(x.engine_dtype)
    adapter_push = bool(a) and x.lora_sync == "adapter"  # the adapters alone
    f["weight push per sync (engine dtype)"] = (a if adapter_push else p) * engine_bytes
    f["weight-sync bucket and its flattened copy"] = 2 * x.sync_bucket_mb * 2**20
    f["weight-sync largest tensor (fp32 + cast)"] = (4 + engine_bytes) * x.vocab_size * x.hidden_size
    trainer_sync = (
        (parameters if offloaded else trainer_idle)
        + f["weight-sync bucket and its flattened copy"]
        + f["weight-sync largest tensor (fp32 + cast)"]
    )
    # Host memory: the offloaded states wait in pinned memory; checkpoints hold the fp32 policy, AdamW and the
    # reference (a submodule of the module) whole.
    f["host pinned memory (offload), per rank"] = sharded if offloaded else 0
    f["host pinned memory (offload), per node"] = sharded * x.ranks_per_node if offloaded else 0
    # A LoRA checkpoint holds the adapters and their AdamW states (GRPOModule.state_dict), not the base.
    f["checkpoint on disk, each"] = 12 * trained + (4 * p if reference else 0)
    kept = checkpoints_on_disk(x)
    f["checkpoints on disk, all kept"] = f["checkpoint on disk, each"] * kept if kept is not None else 0
    phases["weight sync"] = trainer_sync + (engine_weights if released else engine_total)
    phases["generation"] = (0 if offloaded else trainer_idle) + engine_total
    phases["training"] = trainer_training + engine_in_training
    phases["optimizer step"] = trainer_optimizer + engine_in_training

    reasons: list[str] = []
    warnings: list[str] = []
    for phase in phases:
        if phases[phase] > x.gpu_memory:
            reasons.append(
                f"the {phase} phase needs {phases[phase] / GB:.1f} GB per GPU, more than the {x.gpu_memory / GB:.0f} GB "
                f"there are"
            )
    if engine_on_gpu and f["SGLang KV cache"] <= 0:
        reasons.append(
            f"SGLang's weights ({engine_weights / GB:.1f} GB) do not fit in mem_fraction_static={fraction} of "
            f"{x.gpu_memory / GB:.0f} GB: no room for a KV cache"
        )
    if engine_on_gpu and 0 < kv_tokens < worst:
        warnings.append(
            f"the KV cache holds {kv_tokens:,} tokens, less than the step's worst case of {worst:,} "
            "(SGLang queues or retracts requests: slower, not out of memory)"
        )
    if x.engine not in (*COLOCATED_ENGINES, *REMOTE_ENGINES):
        warnings.append(f"engine {x.engine!r}: its memory is not modelled (only SGLang's is)")
    if not x.colocate and engine_on_gpu:
        warnings.append("colocate is false: SGLang keeps its memory during training too")
    if x.max_prompt_length == 0:
        warnings.append("data.max_prompt_length is not set: the worst case counts responses only")
    if x.checkpoint_every_n_steps and x.checkpoints_kept < 0:
        if kept is None:
            count = f"one every {x.checkpoint_every_n_steps} steps without end (no max_steps)"
        else:
            count = f"{kept} of them, {f['checkpoints on disk, all kept'] / GB:,.0f} GB"
        warnings.append(
            f"ModelCheckpoint keeps every checkpoint (save_top_k: -1): {count}; keep the newest k with "
            "save_top_k: k, monitor: step, mode: max"
        )
    return MemoryPlan(f, phases, kv_per_token, kv_tokens, worst, x.gpu_memory, not reasons, reasons, warnings)


def checkpoints_on_disk(x: PlanInputs) -> int | None:
    """How many checkpoints a run leaves on disk at most; None when it saves them without end."""
    if not x.checkpoint_every_n_steps or x.checkpoints_kept == 0:
        return 0
    if x.max_steps > 0:
        saved = x.max_steps // x.checkpoint_every_n_steps
        return saved if x.checkpoints_kept < 0 else min(saved, x.checkpoints_kept)
    return None if x.checkpoints_kept < 0 else x.checkpoints_kept


# ---------------------------------------------------------------------------------------------------- reading


@functools.lru_cache(maxsize=8)
def model_shapes(model_path: str) -> ModelShapes:
    """Parameter counts and sizes of the causal LM at ``model_path``, built on the meta device (no weights read).

    Cached per path for the process (the config is read once).
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if not (Path(model_path) / "config.json").is_file():
        raise ValueError(
            f"model.model_path={model_path!r}: no config.json there; the plan needs only the model's config.json "
            "(download it first, or point model.model_path at a folder that holds it)"
        )
    config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    layers = getattr(getattr(model, "model", model), "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no `.model.layers`")
    num_params = sum(p.numel() for p in model.parameters())
    layer_sizes = [sum(p.numel() for p in layer.parameters()) for layer in layers]
    text = getattr(config, "text_config", None) or config
    heads = text.num_attention_heads
    return ModelShapes(
        num_params=num_params,
        layer_params=max(layer_sizes),
        root_params=num_params - sum(layer_sizes),
        hidden_size=text.hidden_size,
        num_layers=text.num_hidden_layers,
        vocab_size=text.vocab_size,
        num_heads=heads,
        num_kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
        intermediate_size=text.intermediate_size,
    )


@dataclass(frozen=True)
class TrainerLayout:
    """How many GPUs a run takes and how many steps it trains, as its ``trainer`` settings say."""

    devices: int = 1
    nodes: int = 1
    data_parallel_size: int = 1
    max_steps: int = -1


def trainer_layout(trainer: Any) -> TrainerLayout:
    """The layout from the parsed ``trainer`` settings (a jsonargparse namespace or a dict: both have ``get``)."""
    devices = trainer.get("devices", 1)
    devices = devices if isinstance(devices, int) else 1
    nodes = int(trainer.get("num_nodes", 1) or 1)
    strategy = trainer.get("strategy")
    init_args = strategy.get("init_args") if hasattr(strategy, "get") else None
    dp = init_args.get("data_parallel_size") if init_args is not None else None
    max_steps = trainer.get("max_steps", -1)
    return TrainerLayout(
        devices, nodes, dp if isinstance(dp, int) else devices * nodes, max_steps if isinstance(max_steps, int) else -1
    )


def inputs_from_run(
    module: Any, rollout: Any, data: Any, layout: TrainerLayout, gpu_memory: int = 80 * GB, checkpoint: Any = None
) -> PlanInputs:
    """:class:`PlanInputs` from a run's built objects (a ``GRPOModule``, its ``RolloutCallback``, its data module, its
    ``ModelCheckpoint`` if any): what the CLI built from the config, defaults included, never the YAML read again."""
    from lit_agentrl.callbacks.rollout import RolloutCallback

    settings = (rollout if rollout is not None else RolloutCallback()).settings
    engine = settings.engine
    compute = module.compute
    return PlanInputs(
        **dataclasses.asdict(model_shapes(str(module.model_path))),
        param_dtype=str(compute.param_dtype),
        engine_dtype=str(engine.kwargs.get("dtype", "bfloat16")),
        engine_tp_size=int(engine.kwargs.get("tp_size", 1)),
        data_parallel_size=layout.data_parallel_size,
        gpu_memory=gpu_memory,
        micro_batch_tokens=compute.micro_batch_tokens,
        logprob_chunk_tokens=compute.logprob_chunk_tokens,
        gradient_checkpointing=compute.gradient_checkpointing,
        sequence_packing=compute.sequence_packing,
        kl_coef=module.loss.kl_coef,
        entropy_coef=module.loss.entropy_coef,
        temperature=settings.train.sampling.temperature,
        engine=engine.name,
        colocate=engine.colocate,
        trainer_cache_released=engine.colocate,  # RolloutCallback empties the cache before SGLang resumes
        trainer_offloaded=engine.offloads,
        sync_bucket_mb=engine.sync_bucket_mb,
        mem_fraction_static=engine.kwargs.get("mem_fraction_static"),
        enable_memory_saver=bool(engine.kwargs.get("enable_memory_saver", False)),
        prompts_per_step=int(getattr(data, "prompts_per_step", 8)),
        n_samples=settings.train.n_samples,
        max_prompt_length=int(getattr(data, "max_prompt_length", 0) or 0),
        max_new_tokens=settings.train.sampling.max_new_tokens,
        ranks_per_node=layout.devices,
        max_steps=layout.max_steps,
        # ModelCheckpoint keeps the step interval private; a checkpoint saved by epoch or time is not planned
        checkpoint_every_n_steps=getattr(checkpoint, "_every_n_train_steps", None) or None,
        checkpoints_kept=int(getattr(checkpoint, "save_top_k", -1)),
        rollout_servers=len(engine.kwargs.get("urls") or ()),
        rollouts_ahead=settings.async_rollouts.ahead if settings.async_rollouts is not None else 0,
        **_lora_inputs(module),
    )


def _lora_inputs(module: Any) -> dict[str, Any]:
    lora = getattr(module, "lora", None)
    if lora is None or not lora.enabled:
        return {}
    return {
        "lora_rank": int(lora.rank),
        "lora_params": lora_parameters(str(module.model_path), lora),
        "lora_base_dtype": str(lora.base_dtype),
        "lora_sync": str(lora.sync),
    }
