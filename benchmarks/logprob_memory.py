"""Peak host memory of the log-prob computation: full logits (``logprob_chunk_tokens: 0``) vs chunked (the default).

A Qwen3 with Qwen3's 151,936-token vocabulary and a small body (hidden 64, one layer: the head's memory is what
differs) computes the token log-probs and the reported entropy of one packed row, then backward, as the trainer
does for a micro-batch; ``trained`` of the row's tokens carry loss (the rest is prompt). Each case runs in a fresh
process; its figure is the peak resident memory during the computation (``VmHWM`` after resetting it through
``/proc/self/clear_refs``) minus the resident memory before it.

The full-logits path at 16,384 tokens needs more memory than this machine has (each [16384, 151936] fp32 tensor
is 10 GB), so it is measured at smaller sizes and extrapolated linearly (its memory is linear in the tokens; the
two measured sizes show by how much), and the chunked path is measured at 16,384 itself.

    python benchmarks/logprob_memory.py            # prints a markdown table
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

VOCAB = 151_936


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure(model_dir: str, tokens: int, chunk: int, trained: float) -> dict[str, float]:
    """One case in this process: peak memory added by the log-probs' forward and backward, in GB."""
    import torch
    from transformers import AutoModelForCausalLM

    from lit_agentrl.training.logprobs import model_token_logprobs

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = torch.randint(0, VOCAB, (1, tokens))
    targets = torch.randint(0, VOCAB, (1, tokens))
    positions = torch.zeros(1, tokens, dtype=torch.bool)
    positions[:, int(tokens * (1 - trained)) :] = True
    inputs = {"input_ids": ids, "use_cache": False}
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current resident size
    before = _rss_kib("VmRSS")
    out = model_token_logprobs(model, inputs, targets, positions, chunk_tokens=chunk, entropy_grad=False)
    (out.logprobs.sum()).backward()
    peak = _rss_kib("VmHWM")
    return {"tokens": tokens, "chunk": chunk, "peak_gb": (peak - before) * 1024 / 1e9}


def build_model(directory: Path) -> None:
    from transformers import AutoModelForCausalLM, Qwen3Config

    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=False,
    )
    AutoModelForCausalLM.from_config(config).save_pretrained(directory)


def run_case(model_dir: Path, tokens: int, chunk: int, trained: float) -> dict[str, float]:
    command = [sys.executable, __file__, "--case", str(model_dir), str(tokens), str(chunk), str(trained)]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--case", nargs=4, metavar=("MODEL_DIR", "TOKENS", "CHUNK", "TRAINED"))
    parser.add_argument("--tokens", type=int, default=16_384)
    parser.add_argument("--plain-tokens", type=int, nargs=2, default=[1024, 2048])
    parser.add_argument("--chunk", type=int, default=1024)
    parser.add_argument("--trained", type=float, default=0.5, help="fraction of the row's tokens that carry loss")
    args = parser.parse_args()
    if args.case:
        model_dir, tokens, chunk, trained = args.case
        print(json.dumps(measure(model_dir, int(tokens), int(chunk), float(trained))))
        return
    with tempfile.TemporaryDirectory() as tmp:
        build_model(Path(tmp))
        small, large = args.plain_tokens
        plain = [run_case(Path(tmp), n, 0, args.trained) for n in (small, large)]
        chunked = [run_case(Path(tmp), n, args.chunk, args.trained) for n in (small, large, args.tokens)]
    per_token = (plain[1]["peak_gb"] - plain[0]["peak_gb"]) / (large - small)
    plain_at_target = plain[1]["peak_gb"] + per_token * (args.tokens - large)
    print(f"vocabulary {VOCAB:,}, fp32, {args.trained:.0%} of the tokens trained, chunk {args.chunk}\n")
    print("| tokens | full logits (GB) | chunked (GB) | chunked / full |")
    print("|---|---|---|---|")
    for n, p, c in zip((small, large), plain, chunked):
        print(f"| {n:,} | {p['peak_gb']:.2f} | {c['peak_gb']:.2f} | {c['peak_gb'] / p['peak_gb']:.3f} |")
    ratio = chunked[2]["peak_gb"] / plain_at_target
    print(
        f"| {args.tokens:,} | {plain_at_target:.2f} (extrapolated, {per_token * 1e3:.2f} MB/token) "
        f"| {chunked[2]['peak_gb']:.2f} | **{ratio:.3f}** |"
    )


if __name__ == "__main__":
    main()
