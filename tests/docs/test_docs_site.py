"""The documentation site: it builds in MkDocs' strict mode (a broken link, a missing page or a reference to a class
that moved fails), its configuration reference comes from the config classes, the README's example config parses as
the CLI parses it, and the built pages work in a real headless Chromium."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support import REPO_ROOT, chromium_path

from lit_agentrl.cli import parse_run

PAGES = [
    "index", "getting-started", "agents", "sandbox", "data", "configuration", "async", "engines", "metrics", "viewer",
    "checkpoints", "benchmarks", "layout",
]  # fmt: skip


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out


def test_every_page_is_built_and_nothing_is_written_into_the_repository(site: Path):
    for page in PAGES:
        path = site / f"{page}.html"
        assert path.is_file(), page
    assert not (REPO_ROOT / "site").exists()
    # Getting started includes the README's two commands (one text, two places to read it)
    text = html.unescape(re.sub(r"<[^>]+>", "", (site / "getting-started.html").read_text()))
    assert (
        "lit-agentrl fit --config configs/quickstart.yaml" in text and 'pip install torch==2.13.0 -e ".[test]"' in text
    )


def test_the_configuration_reference_is_generated_from_the_config_classes(site: Path):
    page = " ".join((site / "configuration.html").read_text().split())
    for name in (
        "Optimizer",
        "Loss",
        "Correction",
        "Overlong",
        "Compute",
        "AsyncRollouts",
        "EngineSettings",
        "TrainRollouts",
        "ValidationRollouts",
        "Rewards",
        "Health",
        "RolloutCallback",
    ):
        assert re.search(rf'id="lit_agentrl\.[\w.]*\.{name}"', page), name
    # a key's own docstring line, as the dataclass documents it
    assert "the published masked importance sampling" in page and "DAPO's clip-higher" in page


def test_the_readmes_example_config_parses_as_the_cli_parses_it(tmp_path: Path):
    block = (REPO_ROOT / "README.md").read_text().split("```yaml\n", 1)[1].split("```", 1)[0]
    config = tmp_path / "run.yaml"
    config.write_text(block)
    settings = yaml.safe_load(block)
    run = parse_run(["--config", str(config), "--data.train_files", str(REPO_ROOT / settings["data"]["train_files"])])
    assert run.module.optimizer.lr == 5.0e-4 and run.module.correction is None
    (rollout,) = [c for c in run.callbacks if type(c).__name__ == "RolloutCallback"]
    assert rollout.settings.train.n_samples == 8 and rollout.settings.train.sampling.max_new_tokens == 256
    assert rollout.settings.validation.pass_k == (1,) and rollout.settings.health.trajectory_timeout_s == 1800


def test_the_site_in_chromium(site: Path):
    from playwright.sync_api import sync_playwright

    executable = chromium_path()
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, headless=True)
        try:
            page = browser.new_page()
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto((site / "index.html").as_uri())
            assert page.title().startswith("lit-agentrl")
            page.get_by_role("link", name="Configuration").first.click()
            page.wait_for_url("**/configuration.html")
            assert (page.locator("h1").first.text_content() or "").rstrip("¶") == "Configuration"
            assert page.locator('[id="lit_agentrl.config.training.Loss"]').count() == 1
            page.get_by_role("link", name="Asynchronous rollouts").first.click()
            page.wait_for_url("**/async.html")
            assert "ahead" in (page.locator("table").first.text_content() or "")
        finally:
            browser.close()
    assert not errors, errors
