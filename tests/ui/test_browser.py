"""The web view in a real browser: headless Chromium (Debian's package and its chromedriver) loads every
page of a store the test makes, clicks from the list to a rollout to its tokens, and checks what is shown.

Set ``AGL_UI_SCREENSHOTS=docs/img`` to write the documentation's screenshots from this run.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
if CHROMIUM is None or CHROMEDRIVER is None:
    pytest.skip(
        "headless Chromium is not installed (apt-get install chromium chromium-driver)",
        allow_module_level=True,
    )
for _module in ("starlette", "uvicorn", "jinja2"):  # the ui extra
    pytest.importorskip(_module)
webdriver = pytest.importorskip(
    "selenium.webdriver", reason="selenium is not installed (pip install selenium)"
)

from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as ec  # noqa: E402
from selenium.webdriver.support.select import Select  # noqa: E402
from selenium.webdriver.support.wait import WebDriverWait  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture
def browser() -> Any:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1200,900",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
    ):
        options.add_argument(arg)
    # the system chromedriver: Selenium Manager (which would download one) is never asked
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.implicitly_wait(0)
    yield driver
    driver.quit()


def _shot(driver: Any, name: str, tmp_path: Path) -> None:
    """A screenshot of the page, kept small (a 64-colour palette); also into AGL_UI_SCREENSHOTS when set."""
    raw = tmp_path / f"{name}.png"
    driver.save_screenshot(str(raw))
    assert raw.stat().st_size > 1000
    where = os.environ.get("AGL_UI_SCREENSHOTS")
    if not where:
        return
    out = Path(where) / f"{name}.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        from PIL import Image

        Image.open(raw).convert("RGB").quantize(colors=64).save(out, optimize=True)
    except ImportError:
        shutil.copyfile(raw, out)


def _rows(driver: Any) -> list[Any]:
    return driver.find_elements(By.CSS_SELECTOR, "#rollouts tbody a.rollout-link")


def test_list_to_rollout_to_tokens_and_the_run(
    browser: Any, view: Any, small: dict[str, Any], tmp_path: Path
) -> None:
    ids = view.ids
    wait = WebDriverWait(browser, 20)
    browser.get(view.url + "/")
    assert browser.title == "Rollouts · agl-lite"
    assert {a.text for a in _rows(browser)} == {*ids["train"], ids["val"], ids["failed"]}
    _shot(browser, "ui-rollouts", tmp_path)

    # filter: train rollouts whose reward is at most 0.25, through the form
    Select(browser.find_element(By.NAME, "mode")).select_by_value("train")
    browser.find_element(By.NAME, "max_reward").send_keys("0.25")
    browser.find_element(By.ID, "apply").click()
    wait.until(ec.url_contains("mode=train"))
    shown = [a.text for a in _rows(browser)]
    assert set(shown) == {ids["train"][1], ids["train"][3]}
    assert browser.find_element(By.ID, "total").text == "2"

    # to the rollout whose tool failed
    browser.find_element(By.LINK_TEXT, ids["train"][1]).click()
    wait.until(ec.presence_of_element_located((By.ID, "span-tree")))
    assert browser.find_element(By.ID, "rollout-id").text == ids["train"][1]
    assert browser.find_element(By.ID, "ro-status").text == "succeeded"
    tool = browser.find_element(By.ID, f"span-{ids['train'][1]}-tool")
    assert "ZeroDivisionError: division by zero" in tool.text and "ERROR" in tool.text  # open by default
    llm = browser.find_element(By.ID, f"span-{ids['train'][1]}-c1")
    assert "what is 0+2?" not in llm.text  # an LLM call's messages are folded...
    llm.find_element(By.TAG_NAME, "summary").click()
    assert "what is 0+2?" in llm.text and "calculator(" in llm.text  # ...and unfold on a click
    assert "tool_error:calculator" in browser.find_element(By.ID, "transitions").text
    browser.execute_script("window.scrollTo(0, 0)")
    _shot(browser, "ui-rollout", tmp_path)

    # to its tokens
    browser.find_element(By.ID, "tokens-link").click()
    wait.until(ec.presence_of_element_located((By.ID, "legend")))
    assert browser.find_element(By.ID, "shaded-by").text == "advantage"
    first = browser.find_element(By.ID, "call-0")
    toks = first.find_elements(By.CSS_SELECTOR, ".tokens .tok")
    assert "".join(t.text for t in toks).startswith("calc")
    colour = toks[0].value_of_css_property("background-color")
    assert colour.startswith("rgba(200, 40, 40")  # below the group's mean: red
    assert first.find_element(By.CSS_SELECTOR, "td.credited").text == "-0.5"
    assert toks[0].get_attribute("title").startswith("id 99 · logprob -0.500 · advantage -")
    judge = browser.find_element(By.ID, "call-2")
    assert "not trained" in judge.text and "untrained" in judge.get_attribute("class")
    _shot(browser, "ui-tokens", tmp_path)
    browser.find_element(By.ID, "back").click()
    wait.until(ec.presence_of_element_located((By.ID, "span-tree")))

    # the training run: charts drawn by uPlot, and the page follows the file as it grows
    browser.find_element(By.ID, "nav-run").click()
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#charts .uplot")) == 3)
    titles = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#charts .u-title")]
    assert titles == ["Reward", "Loss", "KL to the reference"]
    assert "not logged" in browser.find_element(By.ID, "chart-3").text  # no entropy in these metrics
    assert len(browser.find_elements(By.CSS_SELECTOR, "#evals tbody tr")) == 2
    _shot(browser, "ui-run", tmp_path)
    with open(small["run"] / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 5, "train/reward_mean": 0.95, "val/reward_mean": 0.9}) + "\n")
    wait.until(lambda d: d.find_element(By.ID, "row-count").text == "6")
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#evals tbody tr")) == 3)
    assert "following" in browser.find_element(By.ID, "run-status").text
    assert browser.get_log("browser") == [] or all(e["level"] != "SEVERE" for e in browser.get_log("browser"))


def test_every_page_loads_without_errors(browser: Any, view: Any) -> None:
    for path in (
        "/",
        "/?sort=reward&order=asc",
        f"/rollouts/{view.ids['failed']}",
        f"/tokens/{view.ids['val']}",
        "/run",
        "/rollouts/missing",
    ):
        browser.get(view.url + path)
        severe = [
            e for e in browser.get_log("browser") if e["level"] == "SEVERE" and "missing" not in e["message"]
        ]
        assert severe == [], (path, severe)
    assert browser.find_element(By.ID, "error-message").text == "no rollout 'missing' in this store"
    browser.get(view.url + f"/rollouts/{view.ids['failed']}")
    assert "RuntimeError: the agent crashed" in browser.find_element(By.ID, "ro-error").text
