"""``engine.kwargs.discovery_file`` of ``sglang_router``: the trainer waits for the file a rollout pool's launcher
writes once its servers and router are up, and refuses a malformed one naming the file and the key."""

from __future__ import annotations

import json
import threading

import pytest

from lit_agentrl.engines.sglang_router import read_discovery
from lit_agentrl.errors import UserInputError


def test_the_trainer_waits_for_the_launchers_file(tmp_path):
    path = tmp_path / "pool.json"
    pool = {"router_url": "http://10.0.0.5:31000", "urls": ["http://10.0.0.5:30001", "http://10.0.0.5:30002"]}
    writer = threading.Timer(1.5, lambda: path.write_text(json.dumps(pool)))
    writer.start()
    try:
        assert read_discovery(str(path), timeout_s=30) == pool
    finally:
        writer.cancel()
    path.write_text(json.dumps({"router_url": "http://10.0.0.5:31000"}))
    assert read_discovery(str(path)) == {"router_url": "http://10.0.0.5:31000"}  # the servers: the router's list


def test_a_file_that_never_appears_is_named_with_the_setting_to_raise(tmp_path):
    with pytest.raises(UserInputError, match=r"pool\.json' did not appear within 1 s: .*discovery_timeout_s"):
        read_discovery(str(tmp_path / "pool.json"), timeout_s=1)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("{not json", "is not JSON"),
        (json.dumps({"urls": []}), 'must hold {"router_url": URL'),
        (json.dumps({"router_url": "http://r", "urls": "http://a"}), "'urls' must be a list of URLs"),
    ],
)
def test_a_malformed_file_is_refused_naming_it(tmp_path, content, fragment):
    path = tmp_path / "pool.json"
    path.write_text(content)
    with pytest.raises(UserInputError, match=r"pool\.json") as error:
        read_discovery(str(path))
    assert fragment in str(error.value)
