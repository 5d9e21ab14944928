"""What the gateway's tests share: a row, a tool, an engine that records what it did, and a rollout."""

from __future__ import annotations

from lit_agentrl.engines.base import EngineWrapper
from lit_agentrl.rollout.manager import RolloutManager

SAMPLING = {"max_new_tokens": 48, "temperature": 1.0}
ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
ROW = {
    "agent_name": "gateway_calculator",
    "prompt": [{"role": "user", "content": "What is 2 + 3?"}],
    "ground_truth": "5",
}


class Recording(EngineWrapper):
    """Keeps every request's input ids and every reply's ids and log-probs, as the engine produced them, in the
    order the requests came (concurrent ones too)."""

    def __init__(self, inner) -> None:
        self.inner, self.inputs, self.outputs, self.logprobs = inner, [], [], []

    async def async_generate(self, **kwargs):
        index = len(self.inputs)
        self.inputs.append(list(kwargs["input_ids"]))
        self.outputs.append(None)
        self.logprobs.append(None)
        result = await self.inner.async_generate(**kwargs)
        self.outputs[index] = list(result["output_ids"])
        self.logprobs[index] = [entry[0] for entry in result["meta_info"]["output_token_logprobs"]]
        return result


def rollout(engine, tokenizer, row: dict, n: int = 1):
    """The row's ``n`` trajectories, with the template drift check on (``extra_fields["template_drift"]``)."""
    manager = RolloutManager([engine], tokenizer, check_template_drift=True)
    try:
        return manager.generate([row], n_samples=n, sampling_params=SAMPLING)
    finally:
        manager.close()
