"""The command actor (memento.planners.actor) with fake planners, and HFPlanner.score_options on tiny random models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from memento.errors import ConfigError, GameError
from memento.planners import CallablePlanner, HFPlanner, PlannerError
from memento.planners.actor import ActorChoice, ActorConfig, CommandActor, case_proposals, match_command
from memento.planners.base import AnswerScore
from memento.types import Case, Task

ADMISSIBLE = ["go north", "go south", "take key", "open door"]
LOGP = {"go north": (-1.0, 2), "go south": (-2.0, 2), "take key": (-3.0, 1), "open door": (-0.5, 4)}


def step_case(action: str, reward: float = 1.0) -> Case:
    return Case(state="a room", action=action, reward=reward, meta={"granularity": "step"})


def episode_case(trajectory: str, reward: float = 1.0) -> Case:
    return Case(state="a game", action=trajectory, reward=reward, meta={"granularity": "episode"})


class FakeHF:
    """render / render_continuation / score_options, as HFPlanner has them; records what it was asked."""

    def __init__(self, logp: dict[str, tuple[float, int]] = LOGP):
        self.logp = logp
        self.calls: list[tuple[str, list[str]]] = []

    def render(self, task, cases):
        return f"{task.question}|{len(cases)} case(s)|{task.id}"

    def render_continuation(self, answer: str) -> str:
        return " " + answer

    def score_options(self, prompt, options):
        self.calls.append((prompt, list(options)))
        return [AnswerScore(logprob=self.logp[o.strip()][0], n_tokens=self.logp[o.strip()][1]) for o in options]

    def plan(self, task, cases):
        raise AssertionError("score mode never generates")


def softmax(values) -> np.ndarray:
    e = np.exp(np.asarray(values, dtype=float) - max(values))
    return e / e.sum()


def test_score_mode_mixture_is_exactly_as_specified():
    planner = FakeHF()
    actor = CommandActor(planner, ActorConfig(case_weight=0.3, temperature=2.0))
    choice = actor.act("a dark room", ADMISSIBLE, [step_case("take key"), step_case("OPEN  door")],
                       rng=np.random.default_rng(0), task_id="game1/3")
    assert choice.commands == ("take key", "open door", "go north", "go south")  # proposals first
    assert choice.proposals == ("take key", "open door")
    soft = softmax([-3.0 / 2, -0.5 / 2, -1.0 / 2, -2.0 / 2])
    expected = 0.7 * soft + 0.3 * np.array([0.5, 0.5, 0.0, 0.0])
    np.testing.assert_allclose(choice.probs_A, expected, rtol=0, atol=1e-12)
    assert choice.probs_A.sum() == pytest.approx(1.0, abs=1e-12)
    assert choice.command in choice.commands and not choice.unusable
    prompt, options = planner.calls[0]
    assert prompt == "a dark room|2 case(s)|game1/3" and options == [" take key", " open door", " go north",
                                                                     " go south"]


def test_length_norm_and_no_proposals_means_no_case_mass():
    actor = CommandActor(FakeHF(), ActorConfig(case_weight=0.9, length_norm=True))
    # a case with reward <= 0 proposes nothing, so the whole mass is the planner's
    choice = actor.act("room", ADMISSIBLE, [step_case("take key", reward=0.0)], rng=np.random.default_rng(1))
    assert choice.proposals == () and choice.source == "planner"
    np.testing.assert_allclose(choice.probs_A, softmax([-0.5, -1.0, -3.0, -0.125]), atol=1e-12)


def test_temperature_zero_is_arg_max():
    actor = CommandActor(FakeHF(), ActorConfig(temperature=0.0, case_weight=0.0))
    for seed in range(20):
        choice = actor.act("room", ADMISSIBLE, [step_case("take key")], rng=np.random.default_rng(seed))
        assert choice.command == "open door" and choice.source == "planner"
        assert choice.commands == ("take key", "go north", "go south", "open door")
        assert choice.probs_A.tolist() == [0.0, 0.0, 0.0, 1.0]


def test_draws_follow_probs_and_sources():
    actor = CommandActor(FakeHF(), ActorConfig(case_weight=0.4))
    rng = np.random.default_rng(123)
    counts: dict[str, int] = {}
    sources: dict[str, int] = {}
    n = 4000
    for _ in range(n):
        choice = actor.act("room", ADMISSIBLE, [step_case("go south")], rng=rng)
        counts[choice.command] = counts.get(choice.command, 0) + 1
        sources[choice.source] = sources.get(choice.source, 0) + 1
    for command, p in zip(choice.commands, choice.probs_A):
        assert counts.get(command, 0) / n == pytest.approx(p, abs=0.03)
    assert sources["case"] / n == pytest.approx(0.4, abs=0.03)


def test_same_rng_state_same_choice():
    actor = CommandActor(FakeHF(), ActorConfig())
    cases = [step_case("go south")]
    first = [actor.act("room", ADMISSIBLE, cases, rng=np.random.default_rng(7)).command for _ in range(3)]
    assert len(set(first)) == 1
    rng_a, rng_b = np.random.default_rng(42), np.random.default_rng(42)
    seq_a = [actor.act("room", ADMISSIBLE, cases, rng=rng_a).command for _ in range(30)]
    seq_b = [actor.act("room", ADMISSIBLE, cases, rng=rng_b).command for _ in range(30)]
    assert seq_a == seq_b and len(set(seq_a)) > 1


def test_avoid_repeats():
    planner = FakeHF()
    actor = CommandActor(planner, ActorConfig(case_weight=0.5))
    choice = actor.act("room", ADMISSIBLE, [step_case("open door")], rng=np.random.default_rng(0),
                       tried=["open door", "go north"])
    probs = dict(zip(choice.commands, choice.probs_A))
    assert probs["open door"] == 0.0 and probs["go north"] == 0.0
    # the tried proposal is not allowed, so no case mass either: the planner's softmax over the rest
    np.testing.assert_allclose([probs["go south"], probs["take key"]], softmax([-2.0, -3.0]), atol=1e-12)
    assert planner.calls[-1][1] == [" go south", " take key"]  # tried commands are not even scored
    every = actor.act("room", ADMISSIBLE, [], rng=np.random.default_rng(0), tried=ADMISSIBLE)
    assert (every.probs_A > 0).all()  # all tried: all allowed again
    off = CommandActor(planner, ActorConfig(avoid_repeats=False, case_weight=0.0))
    assert (off.act("room", ADMISSIBLE, [], rng=np.random.default_rng(0), tried=["open door"]).probs_A > 0).all()


def test_max_commands_keeps_proposals_then_the_admissible_order():
    planner = FakeHF()
    actor = CommandActor(planner, ActorConfig(max_commands=2))
    choice = actor.act("room", ADMISSIBLE, [step_case("open door")], rng=np.random.default_rng(0))
    assert choice.commands == ("open door", "go north") and len(choice.probs_A) == 2
    assert planner.calls[-1][1] == [" open door", " go north"]


def test_case_proposals_step_episode_and_rewards():
    admissible = ["go north", "take key", "unlock door with key", "open door", "go east"]
    cases = [
        step_case("Take  Key"),  # admissible spelling returned
        step_case("dance"),  # not admissible
        step_case("go east", reward=0.0),  # reward <= 0: nothing
        episode_case("You are in a hall.\n> go north\nYou go north.\n>take key\n> dance\n> open door"),
        episode_case("go east\nunlock door with key\n", reward=0.0),
        episode_case("unlock door with key\n\ngo north\ngo east"),  # plain lines
        Case(state="s", action="go east", reward=1.0),  # no granularity: one command
    ]
    assert case_proposals(cases, admissible) == ("take key", "go north", "open door", "unlock door with key",
                                                 "go east")
    # an episode case skips commands tried here; a step case still proposes its command
    assert case_proposals(cases[:4], admissible, tried=["take key", "go north"]) == ("take key", "open door")
    assert case_proposals([], admissible) == ()


def test_match_command_rules():
    commands = ["go north", "go south", "take rusty key", "take key", "open door"]
    assert match_command("> Go   North.", commands) == "go north"  # exact, normalised
    assert match_command("take rusty key from table", commands) == "take rusty key"  # contained: the longest
    assert match_command("i will open door now", commands) == "open door"
    assert match_command("go sou", commands) == "go south"  # a command starting with the text
    assert match_command("go", commands) == "go north"  # the first such
    assert match_command("open the key door", commands) == "open door"  # the most shared words (2)
    assert match_command("grab the key", commands) == "take rusty key"  # 1 shared word: the first among ties
    assert match_command("dance wildly", commands) is None
    assert match_command("   ", commands) is None and match_command(">.", commands) is None


def generator(text: str) -> CallablePlanner:
    return CallablePlanner(lambda task, cases: text, name="gen")


def test_generate_mode_mixture_and_unusable_fallback():
    actor = CommandActor(generator("Go south."), ActorConfig(mode="generate", case_weight=0.25))
    choice = actor.act("room", ADMISSIBLE, [step_case("take key")], rng=np.random.default_rng(0))
    probs = dict(zip(choice.commands, choice.probs_A))
    assert probs == pytest.approx({"take key": 0.25, "go north": 0.0, "go south": 0.75, "open door": 0.0})
    assert not choice.unusable
    assert {actor.act("room", ADMISSIBLE, [], rng=np.random.default_rng(s)).command for s in range(10)} == {"go south"}

    bad = CommandActor(generator("xyzzy"), ActorConfig(mode="generate", case_weight=0.5))
    choice = bad.act("room", ADMISSIBLE, [step_case("take key")], rng=np.random.default_rng(0))
    assert choice.unusable
    np.testing.assert_allclose(choice.probs_A, [0.5 + 0.5 / 4, 0.5 / 4, 0.5 / 4, 0.5 / 4], atol=1e-12)
    seen = {bad.act("room", ADMISSIBLE, [], rng=np.random.default_rng(s)).source for s in range(20)}
    assert seen == {"fallback"}
    sources = {bad.act("room", ADMISSIBLE, [step_case("take key")], rng=np.random.default_rng(s)).source
               for s in range(40)}
    assert sources == {"fallback", "case"}
    # a tried command is not matched: the generated "go south" was tried, the closest allowed one is taken
    tried = CommandActor(generator("go south"), ActorConfig(mode="generate", case_weight=0.0))
    assert tried.act("room", ADMISSIBLE, [], rng=np.random.default_rng(0), tried=["go south"]).command == "go north"


def test_score_many_protocol_fallback():
    seen = []

    def score_fn(task, cases, answer):
        seen.append((task.question, len(cases), answer))
        return LOGP[answer][0]

    planner = CallablePlanner(lambda task, cases: "unused", score_fn=score_fn)
    choice = CommandActor(planner, ActorConfig(case_weight=0.0)).act("the hall", ADMISSIBLE, [step_case("x")],
                                                                    rng=np.random.default_rng(0))
    np.testing.assert_allclose(choice.probs_A, softmax([-1.0, -2.0, -3.0, -0.5]), atol=1e-12)
    assert seen == [("the hall", 1, command) for command in ADMISSIBLE]


def test_planner_errors_propagate_and_empty_admissible_is_a_game_error():
    with pytest.raises(PlannerError, match="cannot score"):
        CommandActor(CallablePlanner(lambda t, c: "x")).act("room", ADMISSIBLE, [], rng=np.random.default_rng(0))
    with pytest.raises(GameError, match="no admissible command"):
        CommandActor(FakeHF()).act("room", [], [], rng=np.random.default_rng(0))
    with pytest.raises(GameError, match="not a string"):
        CommandActor(FakeHF()).act("room", "go north", [], rng=np.random.default_rng(0))


@pytest.mark.parametrize("kwargs", [dict(mode="sample"), dict(temperature=-0.1), dict(temperature=float("nan")),
                                    dict(case_weight=1.5), dict(case_weight=-0.1), dict(length_norm=1),
                                    dict(avoid_repeats="yes"), dict(max_commands=0), dict(max_commands=2.0)])
def test_bad_configs_are_config_errors(kwargs):
    field = next(iter(kwargs))
    with pytest.raises(ConfigError, match=f"ActorConfig.{field}="):
        ActorConfig(**kwargs)


def test_choice_json_rounds_probabilities():
    choice = ActorChoice(command="a", commands=("a", "b"), probs_A=np.array([1 / 3, 2 / 3]), source="case",
                         proposals=("a",))
    assert choice.to_json() == {"command": "a", "commands": ["a", "b"], "probs": [0.333333, 0.666667],
                                "source": "case", "proposals": ["a"], "unusable": False}


# ---------------------------------------------------------------- HFPlanner.score_options on tiny random models

WORDS = [*"abcdefghijklmnopqrstuvwxyz", "go", "north", "south", "take", "key", "open", "door", ">", "Question:",
         "Answer:"]


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(["<unk>", "<pad>", "<eos>", "<bos>", *WORDS])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 3)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>",
                                   eos_token="<eos>", bos_token="<bos>"), len(vocab)


@pytest.fixture(scope="module", params=["gemma3", "gpt2"])
def tiny_dir(request, tmp_path_factory) -> Path:
    """A random 3-layer Gemma 3 with a 4-token sliding window on two layers, or a 1-layer GPT-2."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, GPT2Config, GPT2LMHeadModel

    tokenizer, n_vocab = _tokenizer()
    torch.manual_seed(0)
    if request.param == "gemma3":
        config = Gemma3TextConfig(vocab_size=n_vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                  num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=4,
                                  layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                  max_position_embeddings=256, pad_token_id=1, bos_token_id=3, eos_token_id=2)
        model = Gemma3ForCausalLM(config)
    else:
        model = GPT2LMHeadModel(GPT2Config(vocab_size=n_vocab, n_positions=256, n_embd=16, n_layer=1, n_head=2,
                                           bos_token_id=3, eos_token_id=2, pad_token_id=1))
    path = tmp_path_factory.mktemp(request.param) / "model"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


OPTIONS = [" go north", " take key", " open door a b c d e f", " go", " > south south north go key"]


@pytest.mark.parametrize("prompt", ["a b", "Question: a b c d e f g h i j k l m n o p Answer:"])
def test_score_options_equals_score_continuations(tiny_dir, prompt, monkeypatch):
    planner = HFPlanner(tiny_dir, device="cpu", batch_size=2)  # options in several batches, unequal lengths
    ref = planner.score_continuations([prompt] * len(OPTIONS), OPTIONS)
    assert len({round(s.logprob, 3) for s in ref}) == len(OPTIONS)
    full_pass = planner._score_batch
    monkeypatch.setattr(planner, "_score_batch", lambda batch: pytest.fail("score_options ran full sequences"))
    got = planner.score_options(prompt, OPTIONS)
    assert [s.logprob for s in got] == pytest.approx([s.logprob for s in ref], abs=1e-5)
    assert [(s.n_tokens, s.prompt_tokens, s.truncated_tokens) for s in got] == \
           [(s.n_tokens, s.prompt_tokens, s.truncated_tokens) for s in ref]
    assert planner.score_options(prompt, []) == []
    # a cache that cannot be shared: full sequences, the same scores
    monkeypatch.setattr(planner, "_score_batch", full_pass)
    monkeypatch.setattr(planner, "_score_shared_prompt", lambda batch: None)
    assert [s.logprob for s in planner.score_options(prompt, OPTIONS)] == pytest.approx([s.logprob for s in ref],
                                                                                       abs=1e-5)


def test_score_options_truncates_as_score_continuations(tiny_dir):
    planner = HFPlanner(tiny_dir, device="cpu", score_max_length=10)  # each option cuts the prompt differently
    prompt = "a b c d e f g h i j k l"
    ref = planner.score_continuations([prompt] * len(OPTIONS), OPTIONS)
    got = planner.score_options(prompt, OPTIONS)
    assert [s.truncated_tokens for s in got] == [s.truncated_tokens for s in ref] and ref[2].truncated_tokens > 0
    assert [s.logprob for s in got] == pytest.approx([s.logprob for s in ref], abs=1e-5)
    with pytest.raises(PlannerError, match="takes no tokens"):
        planner.score_options(prompt, [" go", ""])


def test_actor_on_a_tiny_hf_planner(tiny_dir):
    planner = HFPlanner(tiny_dir, device="cpu")
    choice = CommandActor(planner, ActorConfig(temperature=0.0, case_weight=0.0)).act(
        "a b c", ["go north", "take key", "open door"], [], rng=np.random.default_rng(0))
    task_prompt = planner.render(Task(id="step", question="a b c", answers=("go north",)), [])
    ref = planner.score_continuations([task_prompt] * 3, [planner.render_continuation(c) for c in choice.commands])
    assert choice.command == choice.commands[int(np.argmax([s.logprob for s in ref]))]
