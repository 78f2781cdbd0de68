"""The chat page at / in a real headless Chromium driven by Selenium: it streams the answer the
target alone would give, marks accepted drafts, shows live statistics, keeps a multi-turn
conversation, and shows errors (a missing API key, a server gone) in the conversation."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.serving import speculative_llm
from verispec import LLM, SamplingParams
from verispec.serve import Server

try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:
    pytest.skip("selenium is not installed (pip install -e '.[test]')", allow_module_level=True)

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
    pytest.skip("needs Debian's chromium and chromedriver (apt-get install chromium "
                "chromium-driver)", allow_module_level=True)  # fmt: skip

pytestmark = pytest.mark.usefixtures("one_thread")

TIMEOUT_S = 60
QUESTION = "What is a fox?"


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    """Headless Chromium with a fresh profile; the flags keep it off the (absent) network."""
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run", "--window-size=1000,800",
                f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):  # fmt: skip
        options.add_argument(arg)
    browser = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)),
                               options=options)  # fmt: skip
    yield browser
    browser.quit()


def open_page(driver: WebDriver, url: str) -> None:
    driver.get(url + "/")
    WebDriverWait(driver, TIMEOUT_S).until(lambda d: by_id(d, "model-name") != "loading model…")


def by_id(driver: WebDriver, element_id: str) -> str:
    """An element's textContent (exact: whitespace as the page holds it)."""
    return driver.execute_script("return document.getElementById(arguments[0]).textContent",
                                 element_id)  # fmt: skip


def texts(driver: WebDriver, selector: str) -> list[str]:
    return driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(e => e.textContent)", selector
    )


def fill(driver: WebDriver, element_id: str, value: object) -> None:
    field = driver.find_element(By.ID, element_id)
    field.clear()
    field.send_keys(str(value))


def ask(driver: WebDriver, text: str | None = None) -> None:
    """Type text (None: send what the box holds) and wait for the answer to end."""
    if text is not None:
        fill(driver, "prompt", text)
    driver.find_element(By.ID, "prompt").send_keys(Keys.ENTER)  # Enter sends
    WebDriverWait(driver, TIMEOUT_S).until(
        lambda d: d.find_element(By.ID, "stats").get_attribute("data-done") == "true"
    )


def settings(driver: WebDriver, max_tokens: int) -> None:
    fill(driver, "temperature", 0)
    fill(driver, "max-tokens", max_tokens)


def test_answer_streams_with_drafts_marked(driver: WebDriver, server: Server,
                                           reference: LLM) -> None:  # fmt: skip
    open_page(driver, server.url)
    assert by_id(driver, "model-name") == "tiny-chat"
    settings(driver, 24)
    ask(driver, QUESTION)
    expected = reference.chat([{"role": "user", "content": QUESTION}],
                              SamplingParams(temperature=0, max_tokens=24))[0]  # fmt: skip
    assert texts(driver, ".user") == [QUESTION]
    assert texts(driver, ".assistant") == [expected.text]
    assert texts(driver, ".error") == []
    drafts = texts(driver, ".assistant .draft")
    assert drafts and all(drafts)
    # every character is in a draft span or a target span
    assert "".join(texts(driver, ".assistant .draft, .assistant .target")) == expected.text
    assert float(by_id(driver, "stat-tokens-per-step")) > 1
    assert re.fullmatch(r"\d+(\.\d+)?%", by_id(driver, "stat-acceptance"))
    assert by_id(driver, "stat-tokens") == str(len(expected.token_ids))
    assert float(by_id(driver, "stat-tps")) > 0
    assert driver.find_element(By.ID, "send").text == "Send"


def test_second_turn_continues_the_conversation(driver: WebDriver, server: Server,
                                                reference: LLM) -> None:  # fmt: skip
    open_page(driver, server.url)
    settings(driver, 12)
    params = SamplingParams(temperature=0, max_tokens=12)
    conversation = [{"role": "user", "content": QUESTION}]
    ask(driver, QUESTION)
    first = reference.chat(conversation, params)[0].text
    conversation += [{"role": "assistant", "content": first},
                     {"role": "user", "content": "And a dog?"}]  # fmt: skip
    ask(driver, "And a dog?")
    second = reference.chat(conversation, params)[0].text
    assert texts(driver, ".assistant") == [first, second]
    assert texts(driver, ".user") == [QUESTION, "And a dog?"]
    driver.find_element(By.ID, "new-chat").click()
    assert texts(driver, ".assistant") == texts(driver, ".user") == []
    ask(driver, "And a dog?")  # a new conversation: the earlier turns are not sent
    alone = reference.chat([{"role": "user", "content": "And a dog?"}], params)[0].text
    assert texts(driver, ".assistant") == [alone]


def test_errors_are_shown_and_the_api_key_is_sent(
    driver: WebDriver, chat_pair: tuple[Path, Path], reference: LLM
) -> None:
    with Server(speculative_llm(chat_pair).engine, port=0, api_key="k") as keyed:
        open_page(driver, keyed.url)
        assert by_id(driver, "model-name") == "model unknown"  # /v1/models needs the key
        settings(driver, 8)
        ask(driver, QUESTION)
        [error] = texts(driver, ".error")
        assert "API key" in error
        assert texts(driver, ".assistant") == []
        # the failed question is back in the box; with the key the same send succeeds
        assert driver.find_element(By.ID, "prompt").get_property("value") == QUESTION
        fill(driver, "api-key", "k")
        ask(driver)
        expected = reference.chat([{"role": "user", "content": QUESTION}],
                                  SamplingParams(temperature=0, max_tokens=8))[0]  # fmt: skip
        assert texts(driver, ".assistant") == [expected.text]
        assert texts(driver, ".user") == [QUESTION, QUESTION]  # the failed one stays, dimmed
        WebDriverWait(driver, TIMEOUT_S).until(  # the key field's change reloads the name
            lambda d: by_id(d, "model-name") == keyed.model_name
        )
        driver.refresh()  # the key is remembered
        assert driver.find_element(By.ID, "api-key").get_property("value") == "k"
    ask(driver, QUESTION)  # the server is gone
    [error] = texts(driver, ".error")
    assert error.startswith("network error")
    driver.execute_script("localStorage.clear()")


FAKE_FETCH = """
const pieces = arguments[0], realFetch = window.fetch;
window.fetch = (url, init) => {
  if (!String(url).endsWith("chat/completions")) return realFetch(url, init);
  const bytes = new TextEncoder();
  const body = new ReadableStream({ start(c) {
    for (const p of pieces) c.enqueue(bytes.encode(p));
    c.close();
  } });
  return Promise.resolve(new Response(body, { headers: { "Content-Type": "text/event-stream" } }));
};
"""


def test_error_event_mid_stream(driver: WebDriver, server: Server) -> None:
    """A stream that breaks off with an error event (fed to the page's fetch, split at odd
    places, CRLF line ends): the text so far stays, marked, and the error is shown."""
    open_page(driver, server.url)
    role = '{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}'
    step = ('{"choices": [{"index": 0, "delta": {"content": "Hello"}, "speculation": '
            '{"num_tokens": 2, "num_accepted_tokens": 1, "num_draft_tokens": 4, '
            '"accepted_text": "Hel"}}]}')  # fmt: skip
    error = '{"error": {"message": "engine step failed: boom", "type": "server_error"}}'
    stream = f"data: {role}\r\n\r\ndata: {step}\r\n\r\ndata: {error}\r\n\r\n"
    driver.execute_script(FAKE_FETCH, [stream[:7], stream[7:60], stream[60:150], stream[150:]])
    ask(driver, QUESTION)
    assert texts(driver, ".assistant") == ["Hello"]
    assert texts(driver, ".assistant .draft") == ["Hel"]
    assert texts(driver, ".assistant .target") == ["lo"]
    assert texts(driver, ".error") == ["engine step failed: boom"]
    assert by_id(driver, "stat-acceptance") == "25.0%"
    assert by_id(driver, "stat-tokens") == "2"
