"""``--planner`` specs: ``openai:MODEL@URL?KEY=VALUE&...`` options parsed strictly, and reaching a loopback server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memento.errors import ConfigError
from memento.planners.spec import MAX_SPEC_CHARS, PlannerSpec, build_planner, parse_planner_spec
from tests.fuzzing import FUZZ, examples, record
from tests.unit.test_openai_compat import FRANCE, ITALY, FakeServer, vllm_echo

URL = "http://127.0.0.1:8080/v1"
KEY_ENV = "MEMENTO_TEST_SPEC_KEY"

GOOD = [
    (f"openai:gemma@{URL}", "gemma", URL, ()),
    (f"openai:qwen2.5:7b@{URL}/", "qwen2.5:7b", f"{URL}/", ()),
    (f"openai:org/m@v1@{URL}?mode=chat", "org/m@v1", URL, (("mode", "chat"),)),
    (f"openai:gemma@{URL}?mode=completions&max_tokens=32&stop=%0A&api_key_env=MY_KEY", "gemma", URL,
     (("mode", "completions"), ("max_tokens", 32), ("stop", ("\n",)), ("api_key_env", "MY_KEY"))),
    (f"openai:m@{URL}?stop=\\n&stop=END%26more&stop=a\\\\b&temperature=0.7", "m", URL,
     (("stop", ("\n", "END&more", "a\\b")), ("temperature", 0.7))),
    (f"openai:m@{URL}?stop=", "m", URL, (("stop", ()),)),
    ("openai:m@https://api.example.com/v1?api_key_env=none&seed=-3&top_p=1&timeout_s=2.5&max_retries=0"
     "&concurrency=256", "m", "https://api.example.com/v1",
     (("api_key_env", None), ("seed", -3), ("top_p", 1.0), ("timeout_s", 2.5), ("max_retries", 0),
      ("concurrency", 256))),
]


@pytest.mark.parametrize(("text", "model", "url", "options"), GOOD)
def test_good_specs_parse_and_write_back(text: str, model: str, url: str, options: tuple[Any, ...]):
    spec = parse_planner_spec(text)
    assert spec == PlannerSpec(kind="openai", model=model, base_url=url, options=options)
    assert parse_planner_spec(str(spec)) == spec
    assert str(parse_planner_spec(f"openai:{model}@{url}")) == f"openai:{model}@{url}"  # no options: no "?"


BAD = [
    (f"openai:m@{URL}?mode=auto", "mode='auto': expected chat or completions"),
    (f"openai:m@{URL}?mode=", "mode='': expected chat or completions"),
    (f"openai:m@{URL}?max_tokens=0", "OpenAICompatConfig.max_tokens=0: must be an integer in 1..1048576"),
    (f"openai:m@{URL}?max_tokens=1048577", "max_tokens=1048577: must be an integer in 1..1048576"),
    (f"openai:m@{URL}?max_tokens=" + "9" * 3000, "max_tokens='999999999999"),
    (f"openai:m@{URL}?max_tokens=1.5", "max_tokens='1.5': expected an integer"),
    (f"openai:m@{URL}?max_tokens=ten", "max_tokens='ten': expected an integer"),
    (f"openai:m@{URL}?temperature=-1", "OpenAICompatConfig.temperature=-1.0: must be a number >= 0"),
    (f"openai:m@{URL}?temperature=nan", "temperature=nan"),
    (f"openai:m@{URL}?timeout_s=1e999", "timeout_s=inf: must be a number > 0"),
    (f"openai:m@{URL}?timeout_s=1e300", "timeout_s=1e+300: must be a number > 0 and <= 86400 (a day)"),
    (f"openai:m@{URL}?timeout_s=soon", "timeout_s='soon': expected a number"),
    (f"openai:m@{URL}?top_p=0", "top_p=0.0: must be None or a number in (0, 1]"),
    (f"openai:m@{URL}?concurrency=257", "concurrency=257: must be an integer in 1..256"),
    (f"openai:m@{URL}?max_retries=101", "max_retries=101: must be an integer in 0..100"),
    (f"openai:m@{URL}?api_key_env=MY-KEY", "api_key_env='MY-KEY': expected an environment variable name"),
    (f"openai:m@{URL}?api_key_env=", "api_key_env='': expected an environment variable name"),
    (f"openai:m@{URL}?key=sk-123", "unknown option 'key' (keys: mode, max_tokens, temperature, stop, api_key_env,"),
    (f"openai:m@{URL}?mode=chat&mode=completions", "option mode given twice"),
    (f"openai:m@{URL}?stop=&stop=x", "an empty stop= (no stop strings) cannot go with other stop= options"),
    (f"openai:m@{URL}?stop=\\q", "stop='\\\\q': unknown escape \\q"),
    (f"openai:m@{URL}?stop=%FF", "stop='%FF': the percent-encoded bytes are not UTF-8"),
    (f"openai:m@{URL}?mode", "option 'mode' is not KEY=VALUE"),
    (f"openai:m@{URL}?", "option '' is not KEY=VALUE"),
    (f"openai:m@{URL}?mode=chat&", "option '' is not KEY=VALUE"),
    ("openai:m", "openai: needs a model and a server URL"),
    ("openai:@http://x/v1", "openai: needs a model and a server URL"),
    ("openai:m@http://", "openai: needs a model and a server URL"),
    ("openai:m@ftp://x/v1", "the server URL 'ftp://x/v1' must start with http:// or https://"),
    ("openai-completions:m@http://x/v1", "unknown planner 'openai-completions'"),
    (f"openai:m@{URL}?stop=" + "x" * MAX_SPEC_CHARS, f"characters, more than the {MAX_SPEC_CHARS} a spec may hold"),
]


@pytest.mark.parametrize(("text", "message"), BAD)
def test_bad_specs_are_one_short_line(text: str, message: str):
    with pytest.raises(ConfigError) as info:
        parse_planner_spec(text)
    line = str(info.value)
    assert line.startswith("planner spec '") and message in line, line
    assert "\n" not in line and len(line) < 400, line  # the spec and the value are shortened


@settings(FUZZ, max_examples=examples(60))
@given(query=st.text(st.sampled_from("=&%\\?@:/ anstop0123456789.-_FfAa\nmodechatcompletionsmax_tokens"),
                     max_size=60))
def test_fuzz_any_query_parses_and_writes_back_or_is_one_line(query: str):
    record(__name__, "inputs")
    text = f"openai:m@{URL}?{query}"
    try:
        spec = parse_planner_spec(text)
    except ConfigError as error:
        assert "\n" not in str(error) and str(error).startswith("planner spec "), str(error)
        return
    except Exception as error:  # noqa: BLE001 - anything else is the bug this test looks for
        record(__name__, "tracebacks")
        raise AssertionError(f"{type(error).__name__} escaped for {text!r}: {error}") from error
    assert parse_planner_spec(str(spec)) == spec


# ---------------------------------------------------------------- the options reach the server


@pytest.fixture(scope="module")
def server():
    fake = FakeServer()
    yield fake
    fake.close()


def test_completions_mode_sends_the_options_as_given(server: FakeServer, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(KEY_ENV, "sk-test")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-this-one")
    server.reset(("json", {"choices": [{"text": " Rome\nQuestion: x"}], "usage": {"prompt_tokens": 9,
                                                                                   "completion_tokens": 4}}))
    spec = parse_planner_spec(f"openai:gemma-base@{server.base_url}?mode=completions&max_tokens=7&stop=%0A"
                              f"&stop=END&temperature=0.3&seed=5&api_key_env={KEY_ENV}")
    with build_planner(spec) as planner:
        out = planner.plan(ITALY, [FRANCE])
    [request] = server.requests
    assert request["path"] == "/v1/completions"
    body = request["body"]
    assert body["model"] == "gemma-base" and body["prompt"].endswith("Question: What is the capital of Italy?\nAnswer:")
    assert (body["max_tokens"], body["stop"], body["temperature"], body["seed"]) == (7, ["\n", "END"], 0.3, 5)
    assert "messages" not in body
    assert request["headers"]["Authorization"] == "Bearer sk-test"
    assert (out.text, out.prompt_tokens, out.output_tokens) == ("Rome", 9, 4)


def test_chat_is_the_default_and_api_key_env_none_sends_no_key(server: FakeServer, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-default")
    server.reset()
    with build_planner(parse_planner_spec(f"openai:m@{server.base_url}")) as planner:
        assert planner.plan(ITALY, []).text == "Rome"
    with build_planner(parse_planner_spec(f"openai:m@{server.base_url}?api_key_env=none&stop=")) as planner:
        assert planner.plan(ITALY, []).text == "Rome"
    first, second = server.requests
    assert first["path"] == second["path"] == "/v1/chat/completions"
    assert first["headers"]["Authorization"] == "Bearer sk-default"  # OPENAI_API_KEY unless told otherwise
    assert "Authorization" not in second["headers"] and "stop" not in second["body"]


def test_constructor_arguments_go_over_the_spec_options(server: FakeServer):
    spec = parse_planner_spec(f"openai:m@{server.base_url}?mode=completions&max_tokens=7")
    with build_planner(spec, max_tokens=3) as planner:
        assert (planner.config.mode, planner.config.max_tokens) == ("completions", 3)


def test_scoring_through_a_spec_asks_for_one_token_never_zero(server: FakeServer):
    server.reset(("fn", vllm_echo))
    with build_planner(parse_planner_spec(f"openai:m@{server.base_url}?mode=completions&max_tokens=7")) as planner:
        [with_case, alone] = planner.score(ITALY, [[FRANCE], []])
    assert [r["body"]["max_tokens"] for r in server.requests] == [1, 1]
    assert [r["path"] for r in server.requests] == ["/v1/completions"] * 2
    assert (with_case.logprob, with_case.n_tokens) == (-0.4, 1) and alone.n_tokens == 1


def test_online_refuses_a_bad_option_in_one_line_before_writing(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    from memento.cli.entry import main

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "t1", "question": "What is the capital of Italy?", "answers": ["Rome"]}\n')
    out = tmp_path / "out"
    code = main(["online", "--tasks", str(tasks), "--planner", "openai:m@http://127.0.0.1:9/v1?mode=auto",
                 "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0] == ("memento: error: planner spec 'openai:m@http://127.0.0.1:9/v1?mode=auto': mode='auto': "
                      "expected chat or completions")
    assert not out.exists()
