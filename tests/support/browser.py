"""Debian's Chromium for the browser tests, installed on first use, driven by Playwright, and the
`dagster dev` it browses."""

import contextlib
import os
import shutil
import signal
import subprocess

import pytest

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-quic"]
"""Without the background-networking flags Chromium keeps dialing hosts this network refuses."""


def ensure_chromium() -> str:
    """The path of Debian's Chromium, installing the package (as root, with apt) if it is missing.

    Playwright's own browser download does not work here; Playwright drives this one instead.
    """
    if os.path.exists(CHROMIUM):
        return CHROMIUM
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.fail(f"the browser tests need Debian's chromium at {CHROMIUM}: apt-get install chromium")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium"], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    assert os.path.exists(CHROMIUM), f"apt-get installed chromium but {CHROMIUM} is missing"
    return CHROMIUM


@contextlib.contextmanager
def dagster_dev_page(definitions, env: dict, log_path):
    """`dagster dev` serving `definitions` on a free port (its own process group, stopped with escalation:
    it ignores SIGTERM for long) and a Chromium page; yields (base URL, page)."""
    from playwright.sync_api import sync_playwright

    from tests.support.helpers import BIN, ROOT, wait_for
    from tests.support.servers import free_port, wait_until_serving

    chromium = ensure_chromium()
    port = free_port()
    with open(log_path, "w") as log:
        server = subprocess.Popen([str(BIN / "dagster"), "dev", "-h", "127.0.0.1", "-p", str(port),
                                   "-f", str(definitions)],
                                  cwd=ROOT, env={**env, "PYTHONUNBUFFERED": "1"},  # its log complete if it dies
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        # A bound against a hang: starting imports every wing in three processes, slow on a loaded 2-core machine.
        wait_until_serving(f"{base}/server_info", server, log_path, 300, "dagster dev")
        # The webserver answers before its code server has loaded the definitions (on a loaded machine, many
        # seconds before): a query then finds no asset. Wait until every code location is loaded.
        wait_for(lambda: locations_loaded(base), "dagster dev to load the definitions", timeout=300, interval=0.5)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=ARGS)
            page = browser.new_page(viewport={"width": 1800, "height": 1100})
            page.set_default_timeout(60_000)
            try:
                yield base, page
            finally:
                browser.close()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)


LOCATIONS = """
query { workspaceOrError { ... on Workspace { locationEntries {
  name loadStatus locationOrLoadError { __typename ... on PythonError { message } } } } } }"""


def locations_loaded(base: str) -> bool:
    """Every code location of the `dagster dev` at `base` has loaded (an error loading one fails at once)."""
    import json
    import urllib.request

    request = urllib.request.Request(f"{base}/graphql", data=json.dumps({"query": LOCATIONS}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        entries = json.load(response)["data"]["workspaceOrError"]["locationEntries"]
    for entry in entries:
        error = entry["locationOrLoadError"]
        if error and error["__typename"] == "PythonError":
            raise AssertionError(f"code location {entry['name']} failed to load: {error['message']}")
    return bool(entries) and all(e["loadStatus"] == "LOADED" for e in entries)

