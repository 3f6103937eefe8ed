"""HFPlanner and chat templates: a tiny random GPT-2 whose tokenizer has (or lacks) a simple chat template."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memento.config import from_dict, to_dict
from memento.errors import ConfigError
from memento.planners import HFPlanner, HFPlannerConfig, PlannerError, PromptConfig, render_prompt
from memento.types import Case, Task

ITALY = Task(id="t1", question="What is the capital of Italy?", answers=["Rome"])
FRANCE = Case(state="What is the capital of France?", action="Paris", reward=1.0)

TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
            "{% if add_generation_prompt %}<|assistant|> {% endif %}")
NO_SYSTEM = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}"
             "{{ raise_exception('System role not supported') }}{% endif %}<|{{ m['role'] }}|> {{ m['content'] }} "
             "<|end|> {% endfor %}{% if add_generation_prompt %}<|assistant|> {% endif %}")
WORDS = ["Question:", "Answer:", "Plan:", "What", "is", "the", "capital", "of", "France?", "Italy?", "Paris", "Rome",
         "<|user|>", "<|system|>", "<|assistant|>", "<|end|>", "Plan.", "1."]


def tiny_lm(path: Path, chat_template: str | None = None) -> Path:
    """A 1-layer random GPT-2 with a word-level tokenizer that adds ``<bos>`` (as Gemma's does)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(["<unk>", "<pad>", "<eos>", "<bos>", *WORDS])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 3)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>",
                                        eos_token="<eos>", bos_token="<bos>")
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    config = GPT2Config(vocab_size=len(vocab), n_positions=256, n_embd=16, n_layer=1, n_head=2,
                        bos_token_id=3, eos_token_id=2, pad_token_id=1)
    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_lm(tmp_path_factory.mktemp("chat") / "model", TEMPLATE)


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_lm(tmp_path_factory.mktemp("base") / "model")


def _reference_logprob(planner: HFPlanner, prompt_ids: list[int], answer_ids: list[int]) -> float:
    import torch

    ids = torch.tensor([prompt_ids + answer_ids])
    with torch.inference_mode():
        logprobs = torch.log_softmax(planner._model(input_ids=ids).logits[0].float(), dim=-1)
    n = len(prompt_ids)
    return float(sum(logprobs[n - 1 + i, token] for i, token in enumerate(answer_ids)))


def test_auto_applies_the_template_to_generation_and_scoring(chat_dir: Path):
    planner = HFPlanner(chat_dir, max_new_tokens=3, stop=())
    tokenizer = planner._tokenizer
    assert planner.uses_chat_template and planner.config.chat_template == "auto"
    prompt = planner.render(ITALY, [FRANCE])
    body = render_prompt(planner.prompt, ITALY, [FRANCE])
    assert prompt == f"<bos><|user|> {body} <|end|> <|assistant|> "
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert prompt_ids.count(tokenizer.bos_token_id) == 1  # the template's <bos>, none added on top
    out = planner.plan(ITALY, [FRANCE])
    assert out.prompt_tokens == len(prompt_ids)
    [score] = planner.score(ITALY, [[FRANCE]])
    answer_ids = tokenizer("Rome", add_special_tokens=False)["input_ids"]  # right after the assistant prefix
    assert (score.n_tokens, score.prompt_tokens) == (1, len(prompt_ids))
    assert score.logprob == pytest.approx(_reference_logprob(planner, prompt_ids, answer_ids), abs=1e-4)
    assert planner.render_continuation("Rome") == "Rome"


def test_off_and_templateless_tokenizers_keep_raw_prompts(chat_dir: Path, base_dir: Path):
    for planner in (HFPlanner(chat_dir, chat_template="off"), HFPlanner(base_dir)):
        assert not planner.uses_chat_template
        prompt = planner.render(ITALY, [FRANCE])
        assert prompt == render_prompt(planner.prompt, ITALY, [FRANCE])
        [score] = planner.score(ITALY, [[FRANCE]])
        prompt_ids = planner._tokenizer(prompt)["input_ids"]  # <bos> added, as before chat templates
        assert prompt_ids[0] == planner._tokenizer.bos_token_id and score.prompt_tokens == len(prompt_ids)
        answer_ids = planner._tokenizer(" Rome", add_special_tokens=False)["input_ids"]
        assert score.logprob == pytest.approx(_reference_logprob(planner, prompt_ids, answer_ids), abs=1e-4)
    with pytest.raises(PlannerError, match="chat_template='on' but the tokenizer has no chat template"):
        HFPlanner(base_dir, chat_template="on")
    switched = HFPlanner(chat_dir).replace(chat_template="off")
    assert not switched.uses_chat_template and switched.config.chat_template == "off"


def test_a_template_without_system_role_gets_the_instruction_in_the_user_turn(tmp_path: Path):
    planner = HFPlanner(tiny_lm(tmp_path / "m", NO_SYSTEM), prompt=PromptConfig(style="memento_plan",
                                                                               instruction="Plan."))
    prompt = planner.render(ITALY, [])
    assert prompt.startswith("<bos><|user|> Plan.\n\n") and prompt.endswith("<|assistant|> ")
    assert "<|system|>" not in prompt


def test_config_saves_chat_template_and_checks_it(chat_dir: Path):
    planner = HFPlanner(chat_dir, chat_template="on")
    data = json.loads(json.dumps(to_dict(planner.config)))
    assert data["chat_template"] == "on"
    config = from_dict(HFPlannerConfig, data)
    assert config == planner.config and HFPlanner.from_config(config).uses_chat_template
    assert from_dict(HFPlannerConfig, {k: v for k, v in data.items() if k != "chat_template"}).chat_template == "auto"
    with pytest.raises(ConfigError, match="HFPlannerConfig.chat_template='yes'"):
        HFPlannerConfig(chat_template="yes")  # type: ignore[arg-type]
