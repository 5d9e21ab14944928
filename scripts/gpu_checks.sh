#!/usr/bin/env bash
# Every GPU-only check in one run, for a machine with a CUDA GPU (tests marked `gpu`, skipped elsewhere):
# colocated SGLang release/resume with memory measured, FSDP2 over NCCL with exact weight sync, bf16 engine.
#   bash scripts/gpu_checks.sh            # uses the current python (torch with CUDA, sglang installed)
set -euo pipefail
cd "$(dirname "$0")/.."
export WANDB_MODE=offline PYTHONUNBUFFERED=1
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU visible'; print(torch.cuda.get_device_name(0))"
python -m pytest -m gpu -s -p no:cacheprovider tests/gpu "$@"
