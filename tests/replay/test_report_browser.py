"""The report in a real browser (issue 32 §4): Debian's chromium, headless, through its
chromedriver (selenium, told the driver's path: nothing is downloaded). The page, opened from a
file with the network cut off, logs no console error, draws its four charts (plotly's SVG in
each), and its screenshot is kept in artifacts/ (gitignored) for a person to look at.

`make test` installs chromium and chromium-driver (the Makefile's `browser` target) where
apt-get can; elsewhere this test skips with one line.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))
from cliproc import in_process  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1400,2400")  # fmt: skip

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or DRIVER is None,
    reason="chromium and chromedriver are not installed (make test installs Debian's chromium chromium-driver where apt-get can)",
)


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("browser")
    log = tmp / "incident.db"
    res = in_process("sim", "incident-prefill-crash", "--requests", "250", "--log", str(log), cwd=tmp)
    assert res.returncode == 0, res.stderr
    out = tmp / "report.html"
    res = in_process("replay", "report", str(log), "-o", str(out), cwd=tmp)
    assert res.returncode == 0, res.stderr
    return out


def test_the_report_renders_in_chromium_with_no_console_error(page: Path, tmp_path: Path) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM  # type: ignore[assignment]
    for flag in (*FLAGS, f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)
    try:
        driver.set_page_load_timeout(60)
        driver.get(page.as_uri())
        # each chart's div gets plotly's SVG once drawn
        drawn = "return Array.from(document.querySelectorAll('.plot')).map(d => d.querySelectorAll('svg.main-svg').length)"
        WebDriverWait(driver, 60).until(lambda d: all(n > 0 for n in d.execute_script(drawn)) and len(d.execute_script(drawn)) == 4)
        traces = driver.execute_script("return Array.from(document.querySelectorAll('.plot')).map(d => d.data.length)")
        heat_cells = driver.execute_script("return document.querySelectorAll('#chart-timeline .heatmaplayer image, "
                                           "#chart-timeline .hm image').length")  # fmt: skip
        curves = driver.execute_script("return document.querySelectorAll('#chart-latency .scatterlayer .js-fill').length")
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        ARTIFACTS.mkdir(exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "report.png"))
    finally:
        driver.quit()
    assert not errors, errors
    # timeline: 2 heatmaps + markers; requests: met, missed; latency: 3; over time: 3
    assert traces[0] >= 5 and traces[1] >= 2 and traces[2:] == [3, 3], traces
    assert heat_cells >= 2 and curves == 3, (heat_cells, curves)
    assert (ARTIFACTS / "report.png").stat().st_size > 50_000
