"""The chat page at `/` in headless Chromium (Debian's `chromium`, driven by Playwright): a prompt
typed in the page streams back token by token, shows tokens/s, context use and the job's status,
and the screenshot of the answer has text in it. Skips where chromium or playwright is missing."""
import io
import re
import shutil

import pytest

pytestmark = pytest.mark.slow
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
WATCH_ANSWER = """() => {
  window.__lengths = [];
  new MutationObserver(() => {
    const t = document.querySelector('.msg.assistant .text');
    if (t) window.__lengths.push(t.textContent.length);
  }).observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true});
}"""


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM:
        pytest.skip("chromium is not installed (ops/test.sh installs Debian's package)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser, live_api):
    page = browser.new_page(viewport={"width": 1100, "height": 700})
    page.set_default_timeout(180_000)
    page.goto(f"{live_api}/")
    page.wait_for_function("document.getElementById('model').textContent.includes('context')")
    yield page
    page.close()


def ink_fraction(png: bytes) -> float:
    """Share of clearly dark pixels: text on the light bubble."""
    from PIL import Image

    gray = Image.open(io.BytesIO(png)).convert("L")
    return sum(1 for v in gray.getdata() if v < 128) / (gray.width * gray.height)


def test_prompt_streams_an_answer_with_live_stats(page, tmp_path, model_ref):
    # the model picker lists the catalog's models with their state in the fleet
    page.wait_for_function("document.getElementById('model-pick').options.length > 0")
    assert page.eval_on_selector("#model-pick", "s => s.value") == model_ref.name
    assert "loaded" in page.inner_text("#model-pick")
    page.evaluate(WATCH_ANSWER)
    page.fill("#temperature", "0")
    page.fill("#max-tokens", "64")
    # an answer of some length: a one-line one can arrive within one relay interval, all at once
    page.fill("#prompt", "Describe Paris, the capital of France, in three sentences.")
    page.press("#prompt", "Enter")
    page.wait_for_selector(".msg.assistant[data-status]")  # set once the turn has ended
    answer = page.inner_text(".msg.assistant .text")
    assert "Paris" in answer
    partial = {n for n in page.evaluate("window.__lengths") if 0 < n < len(answer)}
    assert len(partial) >= 2, "the answer appeared at once, not streamed"
    assert float(page.inner_text("#tps")) > 0
    assert re.fullmatch(r"\d+ / 4096", page.inner_text("#ctx"))
    assert page.inner_text("#state") == "succeeded"
    job = page.locator("#jobs li").first
    assert job.get_attribute("data-status") == "succeeded"
    assert "stop" in page.inner_text(".msg.assistant .info") or "length" in page.inner_text(".msg.assistant .info")

    page.screenshot(path=str(tmp_path / "chat.png"), full_page=True)
    bubble = page.locator(".msg.assistant").screenshot()
    empty = page.locator("#jobs").screenshot()  # reference: no dark text block of that size
    assert ink_fraction(bubble) > 0.01, f"no text visible in the answer (see {tmp_path / 'chat.png'})"
    assert ink_fraction(bubble) > ink_fraction(empty) / 4


def test_second_turn_sends_the_history(page):
    page.fill("#temperature", "0")
    page.fill("#max-tokens", "8")
    page.fill("#prompt", "Say hi.")
    page.press("#prompt", "Enter")
    page.wait_for_selector(".msg.assistant[data-status]")
    with page.expect_request(lambda r: r.url.endswith("/v1/jobs") and r.method == "POST") as sent:
        page.fill("#prompt", "And again.")
        page.press("#prompt", "Enter")
    roles = [m["role"] for m in sent.value.post_data_json["messages"]]
    assert roles == ["user", "assistant", "user"]
    page.wait_for_selector(".msg.assistant:nth-of-type(4)[data-status]")
    assert page.locator("#jobs li").count() == 2


def test_json_mode_switch_sends_response_format(page):
    page.check("#json-mode")
    page.fill("#max-tokens", "16")
    with page.expect_request(lambda r: r.url.endswith("/v1/jobs") and r.method == "POST") as sent:
        page.fill("#prompt", "Give me a JSON object with a name.")
        page.press("#prompt", "Enter")
    assert sent.value.post_data_json["response_format"] == {"type": "json_object"}
    # the page shows the outcome either way: an answer, or the API's error if JSON mode is refused
    page.wait_for_selector(".msg[data-status]")
