"""A rank whose engine another rank owns (an ``sglang_http`` server shared by every rank, pushed by rank 0): after each
push it records the owner's weight version, so its trajectories' staleness is counted from the weights that generated
them, not from version 0 (which ``async_rollouts`` would drop as stale)."""

from __future__ import annotations

from transformers import AutoModelForCausalLM

from lit_agentrl.engines.sglang import SGLangHTTPEngine
from lit_agentrl.rollout.fleet import EngineFleet


def test_a_rank_sharing_a_server_records_the_version_its_owner_pushed(tiny_model_dir):
    engine = SGLangHTTPEngine("http://127.0.0.1:1", str(tiny_model_dir), owner=False)  # never contacted: not ours
    fleet = EngineFleet([engine])
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    for version in (1, 2):
        fleet.push(policy, version)  # this rank gathers with the others, passes the barrier, sends nothing
        assert engine.weight_version == version
