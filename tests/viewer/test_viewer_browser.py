"""The viewer page in a real headless Chromium (Debian's, driven by Playwright): it loads without console errors,
lists every trajectory, filters, shows model-written HTML as text, folds tool calls, colours tokens."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from support import chromium_path

from lit_agentrl.viewer.cli import view_main

SCREENSHOT_COPY = Path("/tmp/viewer_screenshot.png")


def expected_counts(run: Path) -> dict[str, int]:
    lines = [json.loads(line) for line in (run / "trajectories" / "rank0.jsonl").read_text().splitlines()]
    return {
        "all": len(lines),
        "failed": sum(r["failed"] for r in lines),
        "reward>=1": sum(r["reward"] >= 1 for r in lines),
        "mathcode": sum(r["agent_name"] == "mathcode_agent" for r in lines),
        "step1": sum(r["step"] == 1 for r in lines),
    }


def test_viewer_page_in_chromium(logged_run, tmp_path):
    from playwright.sync_api import sync_playwright

    executable = chromium_path()
    out = tmp_path / "view.html"
    assert view_main([str(logged_run), "--out", str(out)]) == 0
    counts = expected_counts(logged_run)
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(out.as_uri())
            check_page(page, counts)
            page.screenshot(path=str(tmp_path / "viewer.png"), full_page=True)
        finally:
            browser.close()
    assert not errors, errors
    assert (tmp_path / "viewer.png").stat().st_size > 10_000
    shutil.copy(tmp_path / "viewer.png", SCREENSHOT_COPY)


def check_page(page, counts: dict[str, int]) -> None:
    rows = page.locator("#list tbody tr")
    total = counts["all"]

    def shown(n: int) -> None:
        assert page.text_content("#count") == f"{n} of {total} trajectories"
        assert rows.count() == n

    shown(total)
    page.select_option("#f-status", "failed")
    shown(counts["failed"])
    page.click("#f-reset")
    page.fill("#f-rmin", "1")
    shown(counts["reward>=1"])
    page.click("#f-reset")
    page.click('#charts circle[data-step="1"] >> nth=0')  # a point of a curve filters to its step
    shown(counts["step1"])
    page.click("#f-reset")

    # model-written HTML shows as text and runs nothing
    page.fill("#f-text", "__pwned")
    shown(5)  # one per training step and validation batch
    rows.first.click()
    assert page.locator("#detail pre.text", has_text="<script>window.__pwned = 1</script>").count() >= 1
    assert page.locator("#detail script, #detail img").count() == 0
    assert page.evaluate("window.__pwned") is None
    page.click("#f-reset")

    # a tool-calling trajectory: its call and the tool's result folded, its tokens coloured on demand
    page.select_option("#f-agent", "mathcode_agent")
    shown(counts["mathcode"])
    rows.nth(1).click()
    call = page.locator("#detail details.call").first
    assert call.get_attribute("open") is None and not page.locator("#detail details.call pre").first.is_visible()
    call.locator("summary").click()
    assert page.locator("#detail details.call pre").first.inner_text() == '{"expr": "6*7"}'
    assert page.locator("#detail details.msg.tool").count() == 1
    tokens = page.locator("#tokens span")
    assert tokens.count() > 0
    page.check('input[name=token-mode][value="logprob"]')
    backgrounds = tokens.evaluate_all("spans => spans.map(s => s.style.background)")
    assert any("rgba(207, 34, 46" in b for b in backgrounds) and "" in backgrounds  # red trained, plain prompt
    page.check('input[name=token-mode][value="mask"]')
    page.check('input[name=token-mode][value="advantage"]')  # the screenshot's colours
    assert page.text_content("#token-legend").startswith("trained tokens: green for a positive advantage")


def test_the_detail_shows_each_turns_reward_and_advantage(logged_run, tmp_path):
    """A trajectory of a turn-level run (``model.loss.advantage``) lists its turns' rewards and advantages; a judged
    one shows what its LLM judge was asked and replied."""
    from playwright.sync_api import sync_playwright

    log = logged_run / "trajectories" / "rank0.jsonl"
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    lines[0] |= {"turn_rewards": [0.0, 0.5], "turn_advantages": [1.25, -0.5]}
    judged = [{"role": "system", "content": "Grade it."}, {"role": "user", "content": "# Response\nfour"}]
    lines[0]["extra"] |= {"judge": {"messages": judged, "reply": "Right. SCORE: 0.75", "score": 0.75}}
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "view.html"
    assert view_main([str(logged_run), "--out", str(out)]) == 0
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), headless=True)
        try:
            page = browser.new_page()
            page.goto(out.as_uri())
            page.locator("#list tbody tr").first.click()
            detail = page.text_content("#detail") or ""
            assert "turn rewards: 1: 0 · 2: 0.5" in detail and "turn advantages: 1: 1.25 · 2: -0.5" in detail
            assert "judge: 0.75" in detail and "Right. SCORE: 0.75" in detail and "# Response\nfour" in detail
        finally:
            browser.close()
