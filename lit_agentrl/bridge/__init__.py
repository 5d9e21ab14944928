"""What crosses between the trainer and the engines, owned by neither.

The trainer's side (``training/``) holds the policy and its optimizer; the engines (``engines/``) know SGLang and
transformers and nothing of the trainer. What moves between them lives here:

* :mod:`.offload`: the trainer's states leaving the accelerator while a colocated engine generates
  (:class:`TrainerOffload`).

The rollout side (``rollout/``, above this floor) drives them; this package imports engines, models and config only.
"""

from lit_agentrl.bridge.offload import TrainerOffload

__all__ = ["TrainerOffload"]
