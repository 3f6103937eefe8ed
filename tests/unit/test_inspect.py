"""``memento inspect``: the HTML pages over a real run of the synthetic env (tests/loop_env.py), via TestClient."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402

from memento.bank import CaseBank  # noqa: E402
from memento.policies import (
    SoftQConfig,
    make_policy,  # noqa: E402
)
from memento.runs.qa import LoopConfig, run_online  # noqa: E402
from memento.serve.inspector import COOKIE, Inspector, cookie_value, inspect_app, svg_line_chart  # noqa: E402
from memento.types import Case  # noqa: E402
from tests.loop_env import ExactJudge, HashingEncoder, make_env  # noqa: E402

EVIL = "<script>alert('x')</script> what is the capital of Atlantis?"
TOKEN = "inspect-token-0123456789"


def make_run(out: Path, steps: int = 12) -> Path:
    env = make_env()
    run_online(LoopConfig(steps=steps, checkpoint_every=0, tensorboard=False, window=4,
                          policy=SoftQConfig(warmup=4)),
               make_policy=make_policy, encoder=HashingEncoder(), planner=env.planner(), judge=ExactJudge(),
               tasks=env.tasks, seed_cases=env.seed_cases, out_dir=out)
    return out


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    out = make_run(tmp_path_factory.mktemp("inspect") / "run")
    with CaseBank.open(out / "bank") as bank:  # an untrusted case text
        bank.add([Case(id="evil", state=EVIL, action="<b>bold</b> & <img src=x onerror=alert(1)>", reward=0.0,
                       env="web")], HashingEncoder().encode([EVIL]))
    return out


@pytest.fixture(scope="module")
def client(run_dir):
    with Inspector.open(run_dir, encoder=HashingEncoder()) as inspector:
        yield TestClient(inspect_app(inspector))


def _rows(page: str) -> list[str]:
    return re.findall(r'<tr class="case" data-case-id="([^"]+)"', page)


def _probs(page: str) -> list[float]:
    return [float(p) for p in re.findall(r'class="num prob" data-prob="([^"]+)"', page)]


def _steps(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]


def test_pages_render(client):
    for url in ("/", "/bank", "/steps", "/step?n=0", "/curves", "/bank?page=1"):
        r = client.get(url)
        assert r.status_code == 200, url
        assert r.headers["content-type"].startswith("text/html")
        assert "script-src" not in r.headers["content-security-policy"]  # default-src 'none': no script at all
        assert "<script" not in r.text
    curves = client.get("/curves").text
    assert "<svg" in curves and 'data-series="run"' in curves and "<polyline" in curves


def test_search_returns_the_case_first(client, run_dir):
    with CaseBank.open(run_dir / "bank", read_only=True) as bank:
        case = next(c for c in bank.iter_cases() if c.state.startswith("In geography class"))
    page = client.get("/bank", params={"q": case.state}).text
    assert _rows(page)[0] == case.id
    assert float(re.search(r'data-score="([^"]+)"', page).group(1)) == pytest.approx(1.0, abs=1e-4)


def test_filters(client):
    zero = client.get("/bank", params={"reward": "zero"}).text
    assert "evil" in _rows(zero)
    assert all(float(r) <= 0 for r in re.findall(r'<td class="num">([0-9.e-]+)</td><td>[^<]*</td><td>[a-z]+</td></tr>',
                                                    zero))
    assert _rows(client.get("/bank", params={"env": "web"}).text) == ["evil"]
    assert _rows(client.get("/bank", params={"env": "web", "reward": "positive"}).text) == []
    assert _rows(client.get("/bank", params={"env": "web", "q": "capital"}).text) == ["evil"]
    assert _rows(client.get("/bank", params={"kind": "no-such-kind"}).text) == []
    first, second = (_rows(client.get("/bank", params={"page": p}).text) for p in (0, 1))
    assert len(first) == 25 and second and not set(first) & set(second)


def test_case_text_is_escaped(client):
    for page in (client.get("/bank", params={"q": EVIL}).text, client.get("/case", params={"id": "evil"}).text,
                 client.get("/bank", params={"env": "web"}).text):
        assert "<script>" not in page and "<img" not in page and "<b>bold" not in page
        assert "&lt;script&gt;" in page
    # the template's autoescape writes the quote as &#39; (html.escape wrote &#x27;: the same character)
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in client.get("/bank", params={"q": EVIL}).text


def test_case_page_shows_usage(client, run_dir):
    steps = _steps(run_dir)
    case_id = steps[0]["chosen_ids"][0]
    page = client.get("/case", params={"id": case_id}).text
    shown = int(re.search(r'id="usage" data-shown="(\d+)"', page).group(1))
    assert shown == sum(s["chosen_ids"].count(case_id) for s in steps)
    assert f'href="/step?r=run&amp;n={steps[0]["step"]}"' in page
    assert client.get("/case", params={"id": "nope"}).status_code == 404


def test_step_page(client, run_dir):
    steps = _steps(run_dir)
    page = client.get("/step", params={"n": 3}).text
    probs = _probs(page)
    assert sum(probs) == pytest.approx(1.0, abs=1e-9)
    assert probs[:len(steps[3]["propensities"])] == pytest.approx(steps[3]["propensities"], rel=1e-9)
    assert re.findall(r'data-rank="(\d+)"', page) == [str(i + 1) for i in range(len(steps[3]["chosen_ids"]))]
    assert 'id="prev" href="/step?r=run&amp;n=2"' in page and 'id="next" href="/step?r=run&amp;n=4"' in page
    assert f'data-reward="{steps[3]["reward"]}"' in page
    assert 'id="prev"' not in client.get("/step", params={"n": 0}).text
    assert client.get("/step", params={"n": 999}).status_code == 404


def test_logged_candidate_distribution_is_shown_whole(run_dir, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    rows = _steps(copy)
    c = len(rows[0]["candidate_ids"])
    rows[0]["candidate_probs"] = [1.0 / c] * c
    (copy / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with Inspector.open(copy, encoder=HashingEncoder()) as inspector:
        page = TestClient(inspect_app(inspector)).get("/step", params={"n": 0}).text
    assert len(_probs(page)) == c and sum(_probs(page)) == pytest.approx(1.0) and 'class="rest"' not in page


def test_comparison_directory(run_dir, tmp_path):
    for name in ("soft_q", "similarity"):
        shutil.copytree(run_dir, tmp_path / name)
    (tmp_path / "comparison.json").write_text(json.dumps({"order": ["soft_q", "similarity"], "window": 4,
                                                          "policies": {"soft_q": {"success_rate": 0.5}}}))
    with Inspector.open(tmp_path, encoder=HashingEncoder()) as inspector:
        assert list(inspector.runs) == ["soft_q", "similarity"]
        c = TestClient(inspect_app(inspector))
        curves = c.get("/curves").text
        assert 'data-series="soft_q"' in curves and 'data-series="similarity"' in curves and "comparison" in curves
        assert c.get("/step", params={"r": "similarity", "n": 1}).status_code == 200
        assert c.get("/bank", params={"b": "soft_q"}).status_code == 200
        assert c.get("/steps", params={"r": "nope"}).status_code == 404


def test_token(run_dir):
    with Inspector.open(run_dir, encoder=HashingEncoder()) as inspector:
        c = TestClient(inspect_app(inspector, token=TOKEN))
        r = c.get("/bank")
        assert r.status_code == 401 and 'name="token"' in r.text and "case" not in _rows(r.text)
        assert c.get("/bank", params={"token": "wrong-token-0123456789"}).status_code == 401
        assert c.get("/bank", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        r = c.get("/bank", params={"token": TOKEN})
        assert r.status_code == 200 and "httponly" in r.headers["set-cookie"].lower()
        # the cookie holds a value derived from the token, never the token itself
        assert TOKEN not in r.headers["set-cookie"] and c.cookies.get(COOKIE) == cookie_value(TOKEN) != TOKEN
        assert c.get("/steps").status_code == 200  # the cookie
        good = cookie_value(TOKEN)
        for forged in (TOKEN, good[:-1] + ("1" if good[-1] == "0" else "0"), cookie_value("another-token-0123456789"),
                       ""):
            other = TestClient(inspect_app(inspector, token=TOKEN), cookies={COOKIE: forged})
            assert other.get("/steps").status_code == 401, forged  # the raw token is no cookie
        fresh = TestClient(inspect_app(inspector, token=TOKEN))
        r = fresh.post("/login", data={"token": TOKEN, "next": "/curves"}, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/curves"
        assert TOKEN not in r.headers["set-cookie"] and cookie_value(TOKEN) in r.headers["set-cookie"]
        assert fresh.get("/curves").status_code == 200
        for elsewhere in ("//evil.example/", "/\\evil.example/", "https://evil.example/"):
            r = fresh.post("/login", data={"token": TOKEN, "next": elsewhere}, follow_redirects=False)
            assert r.headers["location"] == "/"
        assert TestClient(inspect_app(inspector, token=TOKEN)).post(
            "/login", data={"token": "nope"}, follow_redirects=False).status_code == 401


def test_mounted_under_serve():
    from memento.serve.app import create_app
    from tests.unit.test_serve import TOKEN as SERVE_TOKEN
    from tests.unit.test_serve import FakeSelector

    with TestClient(create_app(FakeSelector(), token=SERVE_TOKEN)) as c:
        assert c.get("/inspect/").status_code == 401
        assert c.get("/inspect/", headers={"Authorization": f"Bearer {SERVE_TOKEN}"}).status_code == 200
        r = c.get("/inspect/", params={"token": SERVE_TOKEN})
        assert r.status_code == 200 and 'href="/inspect/"' in r.text


def test_svg_escapes_names():
    svg = svg_line_chart({"<b>": ([0, 1], [0.0, 1.0])}, title="t<", y_label="y")
    assert "<b>" not in svg and "&lt;b&gt;" in svg and "t&lt;" in svg


def test_not_a_run(tmp_path):
    from memento.errors import NotABankError

    with pytest.raises(NotABankError, match="neither a run directory"):
        Inspector.open(tmp_path)


def test_selector_artifact_and_its_feedback_log(tmp_path):
    from memento.selector.export import export_selector
    from memento.selector.runtime import Selector

    make_run(tmp_path / "run", steps=8)
    artifact = export_selector(tmp_path / "run", tmp_path / "selector")
    with Selector.load(artifact, encoder=HashingEncoder()) as selector:
        chosen = selector.select("In geography class, what is the capital city of Peru?", k=2)
        selector.feedback(chosen.selection_id, 1.0)
        case_id = chosen.ids[0]
        with TestClient(inspect_app(Inspector.for_selector(selector))) as c:  # as memento serve mounts it
            assert c.get("/bank", params={"q": "capital of Peru"}).status_code == 200
            assert 'id="feedback" data-count="1"' in c.get("/case", params={"id": case_id}).text
    with Inspector.open(artifact, encoder=HashingEncoder()) as inspector:
        assert not inspector.runs
        c = TestClient(inspect_app(inspector))
        page = c.get("/case", params={"id": case_id}).text
        assert 'id="feedback" data-count="1"' in page and "mean reward 1" in page
        assert c.get("/steps").status_code == 404 and c.get("/").status_code == 200


def test_missing_serve_extra_is_one_line(monkeypatch, run_dir):
    import sys

    from memento.errors import MementoError

    monkeypatch.setitem(sys.modules, "fastapi", None)
    with Inspector.open(run_dir, encoder=HashingEncoder()) as inspector:
        with pytest.raises(MementoError, match=r"pip install -e '\.\[serve\]'"):
            inspect_app(inspector)


# ---------------------------------------------------------------- overview, filters, ticks

SOFT_Q = [0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 1, 0]
SIMILARITY = [1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1]


def _rewrite(run: Path, successes: list[int], policy: str) -> None:
    """The run's steps with the given successes, family a on even steps and b on odd ones, and ``policy``."""
    rows = _steps(run)[:1] * len(successes)
    out = [{**rows[0], "step": i, "success": bool(s), "reward": float(s), "family": "ab"[i % 2], "policy": policy}
           for i, s in enumerate(successes)]
    (run / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in out))


def _attrs(page: str, cls: str) -> list[dict[str, str]]:
    return [dict(re.findall(r'([a-z-]+)="([^"]*)"', m)) for m in re.findall(rf'<tr class="{cls}"([^>]*)>', page)]


@pytest.fixture
def comparison_dir(run_dir, tmp_path) -> Path:
    for name, successes in (("soft_q", SOFT_Q), ("similarity", SIMILARITY)):
        shutil.copytree(run_dir, tmp_path / name)
        _rewrite(tmp_path / name, successes, name)
    (tmp_path / "comparison.json").write_text(json.dumps({"order": ["soft_q", "similarity"], "window": 4,
                                                          "late_steps": 4, "policies": {}}))
    return tmp_path


def test_overview_early_late_per_policy_and_family(comparison_dir):
    with Inspector.open(comparison_dir, encoder=HashingEncoder()) as inspector:
        ov = inspector.overview()
        page = TestClient(inspect_app(inspector)).get("/").text
    # early = steps 0-3 (the window), late = steps 8-11 (late_steps), as memento.runs.spans defines them
    policies = {p["label"]: p for p in ov["policies"]}
    assert policies["soft_q"]["early"]["rate"] == pytest.approx(1 / 4)
    assert policies["soft_q"]["late"]["rate"] == pytest.approx(3 / 4)
    assert policies["similarity"]["late"]["rate"] == pytest.approx(2 / 4)
    assert policies["soft_q"]["late"]["diff"] == pytest.approx(0.25) and policies["soft_q"]["early"]["diff"] == 0
    assert policies["similarity"]["late"]["diff"] is None and ov["baseline"] == "similarity" and not ov["needs"]
    rows = {(a["data-family"], a["data-policy"]): a for a in _attrs(page, "family")}
    assert float(rows["a", "soft_q"]["data-late"]) == 1.0 and float(rows["b", "soft_q"]["data-late"]) == 0.5
    assert float(rows["a", "soft_q"]["data-late-diff"]) == 1.0  # late a: soft_q 2/2, similarity 0/2
    assert float(rows["b", "soft_q"]["data-late-diff"]) == -0.5  # late b: soft_q 1/2, similarity 2/2
    wins = re.search(r'<li data-policy="soft_q">(.*?)</li>', page, re.S).group(1)
    assert re.search(r"better in <a [^>]*>a</a> \(\+1\.000\); worse in b \(-0\.500\)", wins), wins
    policy_rows = {a["data-policy"]: a for a in _attrs(page, "policy")}
    assert float(policy_rows["soft_q"]["data-late-diff"]) == pytest.approx(0.25)


def test_overview_of_one_run_says_what_comparison_needs(run_dir):
    with Inspector.open(run_dir, encoder=HashingEncoder()) as inspector:
        ov = inspector.overview()
        page = TestClient(inspect_app(inspector)).get("/").text
    assert ov["baseline"] is None and len(ov["policies"]) == 1 and 'id="needs"' in page
    assert "memento online --policy soft_q,similarity" in page and "data-late-diff" not in page
    successes = [bool(s["success"]) for s in _steps(run_dir)]
    early = ov["policies"][0]["early"]
    assert (early["n"], early["rate"]) == (4, pytest.approx(sum(successes[:4]) / 4))  # window=4 from the config


def test_steps_filters(comparison_dir):
    _rewrite(comparison_dir / "soft_q", [i % 3 == 0 for i in range(80)], "soft_q")
    with Inspector.open(comparison_dir, encoder=HashingEncoder()) as inspector:
        c = TestClient(inspect_app(inspector))
        page = c.get("/steps", params={"r": "soft_q", "failures": "1"}).text
        shown = _attrs(page, "step fail") + _attrs(page, "step")
        assert len(shown) == 25 and all(a["data-success"] == "false" for a in shown)
        assert 'id="matching" data-count="53"' in page  # 80 steps, 27 successes
        nxt = re.search(r'rel="next" href="([^"]+)"', page).group(1)
        assert "failures=1" in nxt and "page=1" in nxt and "r=soft_q" in nxt
        page = c.get("/steps", params={"r": "soft_q", "failures": "1", "family": "b", "page": "1"}).text
        shown = _attrs(page, "step fail") + _attrs(page, "step")
        assert {a["data-family"] for a in shown} == {"b"} and 'data-count="27"' in page  # odd, not multiple of 3
        assert "family=b" in re.search(r'rel="prev" href="([^"]+)"', page).group(1)
        assert 'data-count="80"' in c.get("/steps", params={"r": "soft_q", "policy": "soft_q"}).text
        for bad in ({"failures": "maybe"}, {"family": "nope"}, {"policy": "<script>"}, {"page": "-1"},
                    {"page": "x"}, {"page": "9" * 5000}, {"family": "f" * 300}, {"n": "1e9"}):
            r = c.get("/step" if "n" in bad else "/steps", params={"r": "soft_q", **bad})
            assert r.status_code == 400, bad
            assert r.text.count("<p") == 1 and "Traceback" not in r.text and "<script>" not in r.text
            assert len(r.text) < 1000, bad  # a huge value is not echoed


def test_nice_ticks_and_windowed_success():
    from memento.charts import nice_ticks, tick_label, windowed_success

    assert nice_ticks(0.0, 1.0) == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert nice_ticks(0, 199, 6, integer=True) == [0, 50, 100, 150, 200]
    assert nice_ticks(3, 11, 6, integer=True) == [2, 4, 6, 8, 10, 12]
    assert [tick_label(t) for t in nice_ticks(0.1, 0.13)] == ["0.1", "0.11", "0.12", "0.13"]
    assert all(float(t).is_integer() for t in nice_ticks(0, 7, 6, integer=True))
    ticks = nice_ticks(0.232, 2.81)
    assert ticks[0] <= 0.232 and ticks[-1] >= 2.81 and [tick_label(t) for t in ticks] == ["0", "1", "2", "3"]
    steps, rate = windowed_success([1, 0, 0, 0, 1, 1], 4)  # drawn from the first full window on
    assert steps == [3.0, 4.0, 5.0] and rate == [0.25, 0.25, 0.5]
    assert windowed_success([1, 1], 4) == ([], [])


def test_curves_ticks_are_nice(client, run_dir):
    page = client.get("/curves").text
    ys = re.findall(r'class="ytick">([^<]+)<', page)
    assert ys[:5] == ["0", "0.25", "0.5", "0.75", "1"]
    xs = re.findall(r'class="xtick">([^<]+)<', page)
    assert xs and all(x.isdigit() for x in xs)
    first = re.search(r'<polyline[^>]*points="([0-9.]+),([0-9.]+)', page)
    # the success curve starts at step 3 (window 4 full), not at step 0 with a one-step mean
    assert float(first.group(1)) > 56 + 1


def test_success_spans_is_the_one_definition():
    from memento.errors import ConfigError
    from memento.runs.spans import success_spans

    assert success_spans(12, window=4, late_steps=4) == {"overall": (0, 12), "early": (0, 4), "late": (8, 12)}
    assert success_spans(3, window=50, late_steps=200) == {"overall": (0, 3), "early": (0, 3), "late": (0, 3)}
    for bad in ({"window": 0, "late_steps": 1}, {"window": 1, "late_steps": True}):
        with pytest.raises(ConfigError):
            success_spans(5, **bad)
