"""HFPlanner.score on the real Gemma 3 270M base: the log-likelihood of a gold answer, no generation.

The reference computation here is independent of the planner's batching: one plain forward pass
over ``tokenizer(prompt) + tokenizer(continuation, add_special_tokens=False)``, every position's
logits, log-softmax, the answer's tokens picked by hand.
"""

from __future__ import annotations

import pytest

from memento.errors import DataFormatError
from memento.planners import HFPlanner, PlannerError, PromptConfig, ScoringPlanner, render_answer
from memento.planners import hf as hf_module
from memento.types import Case, Task

pytestmark = pytest.mark.slow

FRANCE = Case(state="What is the capital of France?", action="Paris", reward=1.0)
GERMANY = Case(state="What is the capital of Germany?", action="Berlin", reward=1.0)
ITALY = Task(id="italy", question="What is the capital of Italy?", answers=["Rome"])

# (task, a correct demonstration with a bare answer, the same demonstration answered in a sentence)
EXACT_ANSWER_TASKS = [
    (ITALY, FRANCE,
     Case(state="What is the capital of France?",
          action="The capital of France is the city of Paris, which lies on the river Seine.", reward=1.0)),
    (Task(id="gold", question="What is the chemical symbol for gold?", answers=["Au"]),
     Case(state="What is the chemical symbol for iron?", action="Fe", reward=1.0),
     Case(state="What is the chemical symbol for iron?",
          action="The chemical symbol for iron is Fe, from the Latin word ferrum.", reward=1.0)),
    (Task(id="sum", question="What is 7 + 6?", answers=["13"]),
     Case(state="What is 2 + 2?", action="4", reward=1.0),
     Case(state="What is 2 + 2?", action="If you add two and two together, you get four.", reward=1.0)),
]


@pytest.fixture(scope="module")
def gemma() -> HFPlanner:
    return HFPlanner.default(device="cpu")


def reference(planner: HFPlanner, prompt: str, continuation: str) -> tuple[float, int, int]:
    """(sum of the continuation's token log-probs, its token count, the prompt's) from one plain forward pass."""
    import torch

    tokenizer, model = planner._tokenizer, planner._model
    prompt_ids = tokenizer(prompt)["input_ids"]
    answer_ids = tokenizer(continuation, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt_ids + answer_ids])
    with torch.inference_mode():
        logprobs = torch.log_softmax(model(input_ids=ids).logits.float(), dim=-1)[0]
    total = sum(float(logprobs[len(prompt_ids) + j - 1, token]) for j, token in enumerate(answer_ids))
    return total, len(answer_ids), len(prompt_ids)


def test_score_equals_a_plain_forward_pass(gemma):
    assert isinstance(gemma, ScoringPlanner)
    case_sets = [[FRANCE], [], [FRANCE, GERMANY]]
    scores = gemma.score(ITALY, case_sets)
    assert len(scores) == 3
    for cases, score in zip(case_sets, scores):
        logprob, n_tokens, prompt_tokens = reference(gemma, gemma.render(ITALY, cases), " Rome")
        assert score.logprob == pytest.approx(logprob, abs=1e-4)
        assert (score.n_tokens, score.prompt_tokens, score.truncated_tokens) == (n_tokens, prompt_tokens, 0)
        assert score.mean_logprob == pytest.approx(score.logprob / score.n_tokens)
        assert score.logprob < 0 and score.latency_s > 0
    # The prompt is read as generation reads it: plan() reports the same prompt token count.
    assert scores[0].prompt_tokens == gemma.plan(ITALY, [FRANCE]).prompt_tokens


def test_batched_equals_one_by_one_and_every_position_logits(gemma, monkeypatch):
    planner = gemma.replace(batch_size=3)  # 7 sequences: batches of 3, 3 and 1, padded to different lengths
    tasks = [ITALY, Task(id="hamlet", question="Who wrote Hamlet?", answers=["William Shakespeare"]),
             Task(id="sum", question="What is 7 + 6?", answers=["13"])]
    case_sets = [[[FRANCE], [], [GERMANY, FRANCE]], [[FRANCE], []], [[GERMANY], [FRANCE, GERMANY]]]
    batched = planner.score_many(tasks, case_sets, answers=[None, None, "13"])
    one_by_one = [[gemma.replace(batch_size=1).score(task, [cases])[0] for cases in sets]
                  for task, sets in zip(tasks, case_sets)]
    assert [len(scores) for scores in batched] == [3, 2, 2]
    for got_scores, want_scores in zip(batched, one_by_one):
        for got, want in zip(got_scores, want_scores):
            assert got.logprob == pytest.approx(want.logprob, abs=1e-4)
            assert (got.n_tokens, got.prompt_tokens) == (want.n_tokens, want.prompt_tokens)
    assert len({s.prompt_tokens for scores in batched for s in scores}) > 3  # the batches really were padded
    # Logits at the answer positions only (transformers' boolean logits_to_keep) equal every position's logits.
    assert hf_module._keeps_boolean_logits(planner._model)
    monkeypatch.setattr(hf_module, "_keeps_boolean_logits", lambda model: False)
    full = planner.score_many(tasks, case_sets, answers=[None, None, "13"])
    for got_scores, want_scores in zip(batched, full):
        for got, want in zip(got_scores, want_scores):
            assert got.logprob == pytest.approx(want.logprob, abs=1e-4)


def test_a_bare_answer_demonstration_makes_the_exact_answer_likelier_than_a_verbose_one(gemma):
    for task, bare, verbose in EXACT_ANSWER_TASKS:
        good, bad = gemma.score(task, [[bare], [verbose]])
        # Measured: Italy -0.69 vs -4.39, gold -1.17 vs -9.14, 7 + 6 -0.88 vs -2.62 (mean log-prob per token).
        assert good.mean_logprob > bad.mean_logprob + 1.0, (task.id, good, bad)


def test_a_longer_answer_has_more_tokens_and_a_lower_likelihood(gemma):
    short, long = (gemma.score(ITALY, [[FRANCE]], answer=answer)[0] for answer in ("Rome", "Rome, the Eternal City"))
    assert long.n_tokens > short.n_tokens == 1
    assert long.logprob < short.logprob  # the same first token, then more terms, each <= 0
    assert long.prompt_tokens == short.prompt_tokens


def test_the_prompt_is_cut_from_the_left_never_the_answer(gemma):
    full = gemma.score(ITALY, [[FRANCE, GERMANY]])[0]
    limit = 12
    cut = gemma.replace(score_max_length=limit).score(ITALY, [[FRANCE, GERMANY]])[0]
    assert cut.prompt_tokens + cut.n_tokens == limit and cut.n_tokens == full.n_tokens
    assert cut.truncated_tokens == full.prompt_tokens + full.n_tokens - limit
    # What the model read: <bos>, then the prompt's last tokens, then the answer.
    import torch

    tokenizer, model = gemma._tokenizer, gemma._model
    prompt_ids = tokenizer(gemma.render(ITALY, [FRANCE, GERMANY]))["input_ids"]
    answer_ids = tokenizer(" Rome", add_special_tokens=False)["input_ids"]
    assert prompt_ids[0] == tokenizer.bos_token_id
    kept = prompt_ids[:1] + prompt_ids[1 + cut.truncated_tokens:]
    with torch.inference_mode():
        logprobs = torch.log_softmax(model(input_ids=torch.tensor([kept + answer_ids])).logits.float(), dim=-1)[0]
    want = sum(float(logprobs[len(kept) + j - 1, t]) for j, t in enumerate(answer_ids))
    assert cut.logprob == pytest.approx(want, abs=1e-4)
    with pytest.raises(PlannerError, match=r"an answer of 5 tokens does not fit in score_max_length=5 "):
        gemma.replace(score_max_length=5).score(ITALY, [[FRANCE]], answer="Rome, the Eternal City")


def test_memento_plan_style_scores_the_plan_as_examples_show_it(gemma):
    planner = gemma.replace(prompt=PromptConfig(style="memento_plan"))
    plan = '{"plan": [{"id": 1, "description": "Recall the capital of Italy."}]}'
    [score] = planner.score(ITALY, [[]], answer=plan)
    continuation = render_answer(planner.prompt, plan)
    assert continuation == "\n1. Recall the capital of Italy."
    logprob, n_tokens, _ = reference(planner, planner.render(ITALY, []), continuation)
    assert score.n_tokens == n_tokens and score.logprob == pytest.approx(logprob, abs=1e-4)


def test_scoring_input_errors(gemma):
    with pytest.raises(DataFormatError, match="no case sets to score"):
        gemma.score(ITALY, [])
    with pytest.raises(DataFormatError, match="the answer '  ' is empty"):
        gemma.score(ITALY, [[FRANCE]], answer="  ")
    assert gemma.score_continuations([], []) == []
