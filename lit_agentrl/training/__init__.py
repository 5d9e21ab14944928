"""The update: GRPOModule (training/module.py), its loss (objective.py, losses.py, correction.py), the log-probs
(logprobs.py), the batches (batching.py), loading and offloading the policy (loading.py, offload.py), checkpoint
files (checkpoint.py) and the validation metrics (evaluation.py)."""
