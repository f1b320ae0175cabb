"""Debian's Chromium for the browser tests, installed on first use, driven by Playwright."""

import os
import shutil
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
