"""The on-call page in a real Airflow API server, opened in headless Chromium; screenshot saved.

Chromium and its driver are Debian packages (`chromium`, `chromium-driver`); the session fixture
installs them with apt-get when missing (skips outside CI when apt cannot).
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.conftest import REPO
from tests.ops.conftest import unavailable

DAG_ID = "tidal_ops_ci"
ARTIFACTS = REPO / "test-artifacts"


@pytest.fixture(scope="session")
def chromium():
    """Paths of chromium and chromedriver, installing the Debian packages if needed."""
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        apt = shutil.which("apt-get")
        if apt is None:
            unavailable("chromium is not installed and apt-get is not available")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        done = subprocess.run([apt, "install", "-y", "-q", "chromium", "chromium-driver"], env=env,
                              capture_output=True, text=True, timeout=900, check=False)
        if done.returncode != 0:
            subprocess.run([apt, "update", "-q"], env=env, capture_output=True, timeout=600, check=False)
            done = subprocess.run([apt, "install", "-y", "-q", "chromium", "chromium-driver"], env=env,
                                  capture_output=True, text=True, timeout=900, check=False)
        if done.returncode != 0:
            unavailable(f"apt-get install chromium chromium-driver failed: {done.stderr[-500:]}")
    return shutil.which("chromium"), shutil.which("chromedriver")


@pytest.fixture
def browser(chromium):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium[0]
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,2200"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(chromium[1]), options=options)
    driver.set_page_load_timeout(180)
    yield driver
    driver.quit()


def _a_successful_run(server) -> str:
    runs = server.api("GET", f"/dags/{DAG_ID}/dagRuns", params={"state": "success", "limit": 1}).json()
    if runs["dag_runs"]:
        return runs["dag_runs"][0]["dag_run_id"]
    server.api("PATCH", f"/dags/{DAG_ID}", json={"is_paused": False})
    run_id = "oncall_page_run"
    server.api("POST", f"/dags/{DAG_ID}/dagRuns", json={"dag_run_id": run_id, "logical_date": None})
    run = server.wait_run(DAG_ID, run_id)
    assert run["state"] == "success", server.why_failed(DAG_ID, run_id)
    return run_id


def test_the_plugin_is_mounted_linked_and_protected(airflow_server):
    import requests

    plugins = airflow_server.api("GET", "/plugins").json()["plugins"]
    [plugin] = [p for p in plugins if p["name"] == "tidal_oncall"]
    assert plugin["fastapi_apps"][0]["url_prefix"] == "/tidal-oncall"
    assert plugin["external_views"][0]["href"] == "/tidal-oncall/"
    assert plugin["external_views"][0]["destination"] == "nav"
    anonymous = requests.get(f"{airflow_server.url}/tidal-oncall/", timeout=60)
    assert anonymous.status_code == 401
    forged = requests.get(f"{airflow_server.url}/tidal-oncall/status", timeout=60,
                          headers={"Authorization": "Bearer not-a-jwt"})
    assert forged.status_code in (401, 403)
    for path in ("docs", "redoc", "openapi.json"):  # issue 22, item 8: they answered without login
        assert requests.get(f"{airflow_server.url}/tidal-oncall/{path}", timeout=60).status_code in (401, 403, 404)


def test_oncall_page_in_headless_chromium(airflow_server, browser):
    from selenium.webdriver.common.by import By

    from tidal.core.load import load_pipeline

    run_id = _a_successful_run(airflow_server)
    pipe = load_pipeline(airflow_server.recipes / "ops_ci.yaml")
    import requests

    status = requests.get(f"{airflow_server.url}/tidal-oncall/status", timeout=120,
                          headers={"Authorization": f"Bearer {airflow_server.token}"})
    assert status.status_code == 200, status.text[:2000]
    [ops_ci] = [r for r in status.json()["recipes"] if r.get("recipe") == "ops_ci"]
    assert {s["status"] for s in ops_ci["steps"]} == {"skip"}
    assert run_id in {r["run_id"] for r in status.json()["runs"][DAG_ID]}
    browser.get(f"{airflow_server.url}/api/v2/monitor/health")  # same origin, so the cookie can be set
    browser.add_cookie({"name": "_token", "value": airflow_server.token, "path": "/"})
    browser.get(f"{airflow_server.url}/tidal-oncall/")
    ARTIFACTS.mkdir(exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "oncall_page.png"))
    (ARTIFACTS / "oncall_page.html").write_text(browser.page_source)

    assert browser.title == "tidal on-call"
    section = browser.find_element(By.ID, DAG_ID)
    assert "ops_ci" in section.text
    text = browser.find_element(By.TAG_NAME, "body").text
    assert run_id in text and "success" in text
    runs = browser.find_elements(By.CSS_SELECTOR, "table.runs")[0].text
    assert run_id in runs and "runs:/" in runs  # the DAG run's MLflow parent run (embedded store: no UI link)
    steps = browser.find_elements(By.CSS_SELECTOR, "table.steps")[0].text
    for step in pipe.graph:
        assert step.step_id in steps
    assert steps.count("committed (cached)") == len(list(pipe.graph))
    checkpoint = browser.find_elements(By.CSS_SELECTOR, "p.checkpoint")[0].text
    assert checkpoint.startswith(f"step {pipe.recipe.train.steps} at ") and "age" in checkpoint
    assert "MLflow:" in text and pipe.tracking_uri in text
    assert "Failure catalog" in text and "Failing gates" in text
    assert (ARTIFACTS / "oncall_page.png").stat().st_size > 10_000
