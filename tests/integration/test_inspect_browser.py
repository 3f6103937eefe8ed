"""``memento inspect`` in a real headless Chromium (Debian's ``chromium``): a real uvicorn server over a real run
of the synthetic env (tests/loop_env.py, the loop ``memento online`` runs), pages read back with
``--dump-dom`` (the DOM after loading) and a ``--screenshot`` PNG. No webdriver.

Without a browser the test installs Debian's ``chromium`` when it runs as root with apt-get, and skips with one
line otherwise.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlencode

import pytest

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")

from memento.bank import CaseBank  # noqa: E402
from memento.serve.inspector import Inspector, inspect_app  # noqa: E402
from tests.loop_env import HashingEncoder  # noqa: E402
from tests.unit.test_inspect import make_run  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def _browser() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for command in (["apt-get", "install", "-y", "-q", "chromium"], ["apt-get", "update", "-q"],
                        ["apt-get", "install", "-y", "-q", "chromium"]):  # the package lists may be missing
            if subprocess.run(command, check=False, capture_output=True, timeout=900, env=env).returncode == 0 \
                    and shutil.which("chromium"):
                break
        found = shutil.which("chromium")
    if found is None:
        pytest.skip("no browser: apt-get install chromium")
    return found


class _Dom(HTMLParser):
    """Every element's tag and attributes, in document order."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, dict(attrs)))

    def having(self, name: str, cls: str | None = None) -> list[dict[str, str | None]]:
        return [a for _, a in self.elements if name in a and (cls is None or cls in (a.get("class") or "").split())]


def _dom(browser: str, url: str, profile: Path) -> _Dom:
    out = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                          f"--user-data-dir={profile}", "--dump-dom", url],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert "</html>" in out, out[-500:]
    dom = _Dom()
    dom.feed(out)
    return dom


@pytest.fixture
def server(tmp_path):
    run = make_run(tmp_path / "run", steps=10)
    inspector = Inspector.open(run, encoder=HashingEncoder())
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(inspect_app(inspector), log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", run
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
        inspector.close()


def test_inspector_in_chromium(server, tmp_path):
    browser = _browser()
    url, run = server
    profile = tmp_path / "profile"

    index = _dom(browser, url + "/", profile)
    assert any(tag == "h1" for tag, _ in index.elements)
    # the overview: early/late per policy and per family; one run, so it says what the comparison needs
    assert [a["data-policy"] for a in index.having("data-policy", "policy")] == ["soft_q"]
    rows = [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines()]
    families = {a["data-family"] for a in index.having("data-family", "family")}
    assert families == {r["family"] for r in rows} and index.having("id") and \
        any(a["id"] == "needs" for a in index.having("id"))

    family = next((r["family"] for r in rows if not r["success"]), rows[0]["family"])  # one with a failure
    failed = [r["step"] for r in rows if r["family"] == family and not r["success"]]
    assert failed or all(r["success"] for r in rows)
    listing = _dom(browser, url + "/steps?" + urlencode({"failures": 1, "family": family}), profile)
    shown = listing.having("data-step")
    assert [int(a["data-step"] or -1) for a in shown] == failed
    assert all(a["data-success"] == "false" and a["data-family"] == family for a in shown)
    checkbox = [a for tag, a in listing.elements if tag == "input" and a.get("name") == "failures"]
    assert checkbox and "checked" in checkbox[0]

    with CaseBank.open(run / "bank", read_only=True) as bank:
        case = list(bank.iter_cases())[5]
    found = _dom(browser, url + "/bank?" + urlencode({"q": case.state}), profile)
    assert found.having("data-case-id", "case")[0]["data-case-id"] == case.id

    step = _dom(browser, url + "/step?n=2", profile)
    probs = [float(a["data-prob"] or "nan") for a in step.having("data-prob", "prob")]
    assert len(probs) >= 2 and sum(probs) == pytest.approx(1.0, abs=1e-9)
    assert [a["id"] for a in step.having("id") if a["id"] in ("prev", "next")] == ["prev", "next"]

    shot = tmp_path / "step.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    f"--user-data-dir={profile}", f"--screenshot={shot}", "--window-size=1280,900",
                    "--hide-scrollbars", url + "/step?n=2"], capture_output=True, timeout=120, check=True)
    data = shot.read_bytes()
    assert data[:8] == PNG and len(data) > 1000
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1280, 900)
    curves = tmp_path / "curves.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    f"--user-data-dir={profile}", f"--screenshot={curves}", "--window-size=1280,900",
                    url + "/curves"], capture_output=True, timeout=120, check=True)
    assert curves.read_bytes()[:8] == PNG
    assert re.search(r"<svg[^>]*>.*<polyline", _dom_text(browser, url + "/curves", profile), re.S)


def _dom_text(browser: str, url: str, profile: Path) -> str:
    return subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
                           "--dump-dom", url], capture_output=True, text=True, timeout=120, check=True).stdout
