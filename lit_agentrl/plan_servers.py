"""The rollout servers' side of ``lit-agentrl plan`` when generation runs on GPUs of its own (``engine: sglang_http``
or ``sglang_router``): each server GPU's weights and KV cache, the step's tokens per server, and what one weight push
moves over each transport.

The trainer's GPUs are planned by :func:`lit_agentrl.plan.plan_memory` (without an engine beside the trainer); this
plans the others. A server's memory is SGLang's ``mem_fraction_static`` of its GPU (SGLang's default on 80 GB-class
GPUs when unset): the weights split over its tensor-parallel GPUs, the rest KV cache. The push seconds are estimates
at the stated bandwidths, not measurements.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lit_agentrl.models.dtypes import dtype_bytes
from lit_agentrl.plan import GB, SGLANG_DEFAULT_MEM_FRACTION, PlanInputs

TRANSPORT_BANDWIDTH = {
    "collective": (25 * GB, "NCCL broadcast at 25 GB/s (one 200 Gb/s InfiniBand link, or PCIe 4 x16)"),
    "disk": (2 * GB, "written once per server and read back, at 2 GB/s of shared storage"),
    "inline": (GB // 2, "pickled and base64 in an HTTP request (4/3 of the bytes) at 0.5 GB/s"),
}
"""Transport -> (bytes per second, what that assumes): the push seconds are these estimates."""


@dataclass
class ServerPlan:
    """Per server GPU: its figures and verdict; per push: the bytes and estimated seconds of each transport."""

    servers: int  # 0: not listed in the config (the router's own list)
    figures: dict[str, int]
    kv_capacity_tokens: int
    tokens_per_server: int
    push_bytes: int
    push_seconds: dict[str, float]
    gpu_memory: int
    fits: bool
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def table(self) -> str:
        rows = [(name, f"{value / GB:10.2f} GB") for name, value in self.figures.items()]
        rows += [("GPU memory", f"{self.gpu_memory / GB:10.2f} GB"), ("", "")]
        rows.append(("KV capacity (tokens)", f"{self.kv_capacity_tokens:>13,d}"))
        rows.append(("worst case per server (tokens)", f"{self.tokens_per_server:>13,d}"))
        rows.append(("weight push, bytes to each server", f"{self.push_bytes / GB:10.2f} GB"))
        rows += [(f"weight push over {name}", f"{s:10.1f} s") for name, s in self.push_seconds.items()]
        width = max(len(name) for name, _ in rows)
        lines = [f"{name:<{width}}  {value}" if name else "" for name, value in rows]
        lines += [f"  ({name}: {TRANSPORT_BANDWIDTH[name][1]})" for name in self.push_seconds]
        lines += [f"warning: {w}" for w in self.warnings]
        verdict = "FITS" if self.fits else "DOES NOT FIT"
        lines.append(f"verdict: {verdict}" + (f": {self.reasons[0]}" if self.reasons else ""))
        return "\n".join(lines)


def plan_servers(x: PlanInputs) -> ServerPlan:
    """The plan of one rollout server's GPU, and of one weight push to it."""
    engine_bytes = dtype_bytes(x.engine_dtype)
    fraction = x.mem_fraction_static if x.mem_fraction_static is not None else SGLANG_DEFAULT_MEM_FRACTION
    total = int(fraction * x.gpu_memory)
    weights = x.num_params * engine_bytes // x.engine_tp_size
    figures = {"SGLang weights (per GPU)": weights, "SGLang KV cache (per GPU)": total - weights}
    kv_split = min(x.engine_tp_size, x.num_kv_heads)
    kv_per_token = 2 * x.num_layers * x.num_kv_heads * x.head_dim * engine_bytes // kv_split
    capacity = max(0, total - weights) // kv_per_token
    in_flight = x.prompts_per_step * x.n_samples * (1 + x.rollouts_ahead)  # the step's and the ones ahead
    per_server = in_flight * (x.max_prompt_length + x.max_new_tokens) // max(x.rollout_servers, 1)
    adapter_push = x.lora_params > 0 and x.lora_sync == "adapter"
    push = (x.lora_params if adapter_push else x.num_params) * engine_bytes
    seconds = {
        name: push * (4 / 3 if name == "inline" else 1) / rate for name, (rate, _) in TRANSPORT_BANDWIDTH.items()
    }
    reasons, warnings = [], []
    if total <= weights:
        reasons.append(
            f"SGLang's weights ({weights / GB:.1f} GB per GPU) do not fit in mem_fraction_static={fraction} of "
            f"{x.gpu_memory / GB:.0f} GB: raise engine.kwargs.tp_size or the server's --mem-fraction-static"
        )
    elif capacity < per_server:
        warnings.append(
            f"a server's KV cache holds {capacity:,} tokens, less than its share of the worst case, {per_server:,} "
            "(SGLang queues or retracts requests: slower, not out of memory)"
        )
    if not x.rollout_servers:
        warnings.append("engine.kwargs.urls not listed: the worst case is counted as if one server took it all")
    if x.max_prompt_length == 0:
        warnings.append("data.max_prompt_length is not set: the worst case counts responses only")
    return ServerPlan(
        x.rollout_servers, figures, capacity, per_server, push, seconds, x.gpu_memory, not reasons, reasons, warnings
    )
