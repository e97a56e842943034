"""The playground in a real browser against a real ``dprc serve`` and its generation engine:
``/playground?model=dprc-tiny-llama`` preselects the model; two turns of a conversation stream
into the page, each equal to what the official ``openai`` client's ``chat.completions.create``
(temperature 0, the same max tokens) answers for the same conversation; Stop on a long answer
(the page's network throttled, so that it is still streaming) ends it and gives the Send button
back; an unknown model is an error in the page's error style and the message goes back into
its box; the page at a phone's width; a succeeded job's page links to the playground with its
``ft:`` model, which answers as the client's call does. No script error or CSP violation."""

from __future__ import annotations

import time
from urllib.parse import quote

import openai
import pytest

from tests.browser.conftest import PHONE, Dashboard
from tests.browser.test_dashboard import Watch, _lines, _sign_in

TINY = "dprc-tiny-llama"
MAX_TOKENS = 6


def _sdk_answer(dashboard: Dashboard, key: str, messages: list[dict], model: str = TINY) -> str:
    """The official client's answer (not streamed) at temperature 0: the reference."""
    client = openai.OpenAI(base_url=f"{dashboard.url}/v1", api_key=key, max_retries=0, timeout=120)
    answer = client.chat.completions.create(
        model=model, messages=messages, max_tokens=MAX_TOKENS, temperature=0
    )
    return answer.choices[0].message.content or ""


def _send(page, text: str) -> None:
    page.fill("#pg-message", text)
    page.click("#pg-send")


def _answer(page, n: int) -> str:
    """The text of the n-th answer (0-based; the turns alternate), once it is finished."""
    done = page.locator(f"#pg-conversation > li:nth-child({2 * n + 2})[data-state=done]")
    done.wait_for()
    return done.locator(".turn-text").text_content() or ""


def test_the_playground_streams_a_conversation_and_stops(dashboard, new_context):
    key = dashboard.key("player")
    api = dashboard.api("player")
    page = new_context().new_page()
    watch = Watch(page)
    _sign_in(page, dashboard.url, key)
    page.click("nav >> text=Playground")
    page.wait_for_selector("#pg-model[data-loaded=true]")
    page.goto(f"{dashboard.url}/playground?model={TINY}")
    page.wait_for_selector("#pg-model[data-loaded=true]")
    assert page.locator("#pg-model").input_value() == TINY
    listed = {m["id"] for m in api.get("/v1/models").json()["data"] if m["task"] == "causal_lm"}
    assert set(page.locator("#pg-model option").all_inner_texts()) == listed
    for field in ("#pg-model", "#pg-system", "#pg-max-tokens", "#pg-temperature", "#pg-message"):
        assert page.locator(f"label:has({field})").count() == 1  # every field has its label

    page.fill("#pg-max-tokens", str(MAX_TOKENS))
    page.fill("#pg-temperature", "0")
    _send(page, "hello there")
    first = _answer(page, 0)
    conversation = [{"role": "user", "content": "hello there"}]
    assert first and first == _sdk_answer(dashboard, key, conversation)
    assert page.locator("#pg-send").is_enabled() and page.locator("#pg-stop").is_disabled()

    # a second turn, sent from the keyboard: the page sends the whole conversation
    page.fill("#pg-message", "and then?")
    page.press("#pg-message", "Control+Enter")
    second = _answer(page, 1)
    conversation += [
        {"role": "assistant", "content": first},
        {"role": "user", "content": "and then?"},
    ]
    assert second == _sdk_answer(dashboard, key, conversation)
    dashboard.shot(page, "playground")

    # Stop: a long answer over a slow network is still streaming when Stop is pressed
    cdp = page.context.new_cdp_session(page)
    cdp.send("Network.enable")
    cdp.send(
        "Network.emulateNetworkConditions",
        {"offline": False, "latency": 0, "downloadThroughput": 1500, "uploadThroughput": -1},
    )
    page.fill("#pg-max-tokens", "400")
    _send(page, "tell me a long story")
    page.wait_for_selector("#pg-conversation[data-state=streaming]")
    assert page.locator("#pg-send").is_disabled()
    long = page.locator(".turn.assistant").nth(2)
    deadline = time.monotonic() + 60  # (wait_for_function evaluates a string: the CSP refuses)
    while len(long.locator(".turn-text").text_content() or "") < 4:
        assert time.monotonic() < deadline, "the long answer did not start"
        page.wait_for_timeout(100)
    page.click("#pg-stop")
    page.wait_for_selector("#pg-send:enabled")
    assert long.get_attribute("data-state") == "stopped"
    assert page.locator("#pg-stop").is_disabled()
    assert page.locator("#pg-error").inner_text() == ""
    cdp.send(
        "Network.emulateNetworkConditions",
        {"offline": False, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
    )

    # New conversation, then a refusal: shown in the error style, the message kept
    page.click("#pg-reset")
    assert page.locator(".turn").count() == 0
    page.evaluate(
        "document.getElementById('pg-model').append(new Option('no-such-model', 'no-such-model'))"
    )
    page.select_option("#pg-model", "no-such-model")
    _send(page, "anyone?")
    error = page.locator("#pg-error .error[role=alert]")
    error.wait_for()
    assert "no-such-model" in error.inner_text()
    assert page.locator("#pg-message").input_value() == "anyone?"
    assert page.locator(".turn").count() == 0
    assert watch.errors == [], watch.errors


def test_the_playground_at_a_phone_width(dashboard, new_context):
    key = dashboard.key("player")
    page = new_context(PHONE).new_page()
    watch = Watch(page)
    _sign_in(page, dashboard.url, key)
    page.goto(f"{dashboard.url}/playground?model={TINY}")
    page.wait_for_selector("#pg-model[data-loaded=true]")
    page.fill("#pg-max-tokens", str(MAX_TOKENS))
    page.fill("#pg-temperature", "0")
    _send(page, "hi")
    text = _answer(page, 0)
    assert text == _sdk_answer(dashboard, key, [{"role": "user", "content": "hi"}])
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"], width  # nothing wider than the screen
    dashboard.shot(page, "playground_phone", full_page=True)
    assert watch.errors == [], watch.errors


@pytest.mark.slow  # a tiny job runs to its end first (tens of seconds)
def test_a_succeeded_jobs_page_opens_the_playground_with_its_model(dashboard, new_context):
    key = dashboard.key("player-ft")
    api = dashboard.api("player-ft")
    f = api.post(
        "/v1/files",
        files={"file": ("t.jsonl", _lines(16, " playground").encode())},
        data={"purpose": "fine-tune"},
    ).json()
    created = api.post(
        "/v1/fine_tuning/jobs",
        json={
            "model": TINY,
            "training_file": f["id"],
            "hyperparameters": {"n_epochs": 1, "batch_size": 8, "max_seq_len": 32},
            "privacy": {"target_epsilon": 8.0, "clipping": {"method": "exact"}},
        },
    )
    assert created.status_code == 200, created.text
    job_id = created.json()["id"]
    deadline = time.monotonic() + 240
    while (job := api.get(f"/v1/fine_tuning/jobs/{job_id}").json())["status"] != "succeeded":
        assert job["status"] not in ("failed", "cancelled"), job
        assert time.monotonic() < deadline, job["status"]
        time.sleep(0.2)
    model = job["fine_tuned_model"]
    assert model and model.startswith("ft:")

    page = new_context().new_page()
    watch = Watch(page)
    _sign_in(page, dashboard.url, key)
    page.goto(f"{dashboard.url}/jobs/{job_id}")
    link = page.locator("#playground")
    link.wait_for(state="visible")
    assert link.get_attribute("href") == f"/playground?model={quote(model, safe='')}"
    link.click()
    page.wait_for_selector("#pg-model[data-loaded=true]")
    assert page.locator("#pg-model").input_value() == model
    page.fill("#pg-max-tokens", str(MAX_TOKENS))
    page.fill("#pg-temperature", "0")
    _send(page, "hello")
    messages = [{"role": "user", "content": "hello"}]
    assert _answer(page, 0) == _sdk_answer(dashboard, key, messages, model)
    assert watch.errors == [], watch.errors
