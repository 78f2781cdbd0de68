"""Method self: the target drafts for itself with some of its decoder layers skipped.

The draft is the target's LlamaModel without the skipped layers (LlamaModel.without_layers): the
same weight tensors, nothing copied, so any model speculates with no second model and no extra
weights. It drafts as a separate draft model does (DraftModelProposer), with a paged KV cache
of its own for its kept layers: from the first skipped layer on, the draft's residual stream
differs from the target's, so the keys and values of every later layer differ as well and the
target's cannot stand in for them (docs/design.md, 5). The skip set (and k) is the user's
(SpecConfig.self_skip_layers), a stored calibration (SpecConfig.self_calibration), or chosen
at load by a calibration on a few prompts (drafters/skip_search.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from verispec.config import SpecConfig, SpecError, SpecField
from verispec.drafters.draft_model import DraftModelProposer
from verispec.drafters.skip_search import SkipChoice, calibrate
from verispec.engine.drafter import TargetInfo
from verispec.models.catalog.hub import say_on_stderr
from verispec.tokenizer import Tokenizer
from verispec.types.chat import chat_prompt

CALIBRATION_PROMPTS = (
    "Explain how the gears on a bicycle make it easier to ride up a steep hill.",
    "Write a Python function that returns the largest even number in a list, or None.",
    "Give three tips for writing a clear email to a colleague you have not met.",
    "In two sentences, why does the sky look blue during the day?",
)
"""What the calibration continues when nobody gives it prompts: everyday requests, each as a
user turn of the model's chat template when it has one (verispec.drafters.skip_search.calibrate
takes any prompts, e.g. a workload's own, and SkipChoice.save stores its choice)."""


@dataclass(frozen=True, slots=True)
class SelfDraftConfig:
    """Self-speculation's options: the layers its draft skips, or a calibration file holding
    them, not both (neither: calibrated at load)."""

    SPEC_FIELDS: ClassVar[dict[str, str]] = {"skip_layers": "self_skip_layers",
                                             "calibration": "self_calibration"}  # fmt: skip
    skip_layers: tuple[int, ...] | None = None
    """Distinct layer indices >= 0 (a list or tuple, any order; kept sorted). The target's
    layer count is checked at load (drafters/self_draft.check_skip_layers)."""
    calibration: str | None = None

    def __post_init__(self) -> None:
        if self.skip_layers is not None and self.calibration is not None:
            raise SpecError("give ", SpecField("self_skip_layers"), " or ",
                            SpecField("self_calibration"), ", not both: a calibration file holds "
                            "its own skip set")  # fmt: skip
        value = self.skip_layers
        if value is not None:
            layers = isinstance(value, list | tuple) and all(
                isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value
            )
            if not layers or not value:
                raise SpecError(SpecField("self_skip_layers"), " must be a non-empty list of "
                                "layer indices (integers >= 0), e.g. (10, 14, 20), or None to "
                                f"calibrate; got {value!r}")  # fmt: skip
            if len(set(value)) != len(value):
                raise SpecError(SpecField("self_skip_layers"), f" names a layer twice: {value!r}")
            object.__setattr__(self, "skip_layers", tuple(sorted(value)))
        if self.calibration is not None and (
            not isinstance(self.calibration, str) or not self.calibration
        ):
            raise SpecError(SpecField("self_calibration"), " must be a file path (a string), got "
                            f"{self.calibration!r}")  # fmt: skip

    @classmethod
    def of(cls, spec: SpecConfig) -> SelfDraftConfig:
        return spec.options(cls)


def check_skip_layers(
    skip: Sequence[int], num_layers: int, where: str = "self_skip_layers"
) -> None:
    """Skipped layers must be layers of the target (0..num_layers - 1) and leave at least one."""
    bad = [i for i in skip if not 0 <= i < num_layers]
    if bad:
        raise ValueError(f"{where} {list(skip)}: layers {bad} are outside 0..{num_layers - 1} "
                         f"(the target has {num_layers} decoder layers)")  # fmt: skip
    if len(set(skip)) >= num_layers:
        raise ValueError(f"{where} skips all {num_layers} layers of the target; the draft must "
                         "keep at least one")  # fmt: skip


class SelfDraftProposer(DraftModelProposer):
    """A DraftModelProposer whose model is the target without the choice's skipped layers."""

    def __init__(self, choice: SkipChoice, num_speculative_tokens: int, target: TargetInfo) -> None:
        check_skip_layers(choice.skip_layers, len(target.model.layers))
        view = target.model.without_layers(choice.skip_layers)
        if target.compile:
            view.compile()
        k = choice.num_speculative_tokens
        depth = None if k is None else min(k, num_speculative_tokens)
        super().__init__(view, num_speculative_tokens, target, depth)
        self.choice = choice
        """The skip set and k this proposer drafts with (and the calibration's figures)."""


def make_self_proposer(
    skip_layers: tuple[int, ...] | None,
    calibration: str | None,
    num_speculative_tokens: int,
    target: TargetInfo,
    say: Callable[[str], None] = say_on_stderr,
) -> SelfDraftProposer:
    """The proposer for SpecConfig(method="self"): with the given skip set; else the one stored
    in the calibration file when it exists; else calibrated now (k up to num_speculative_tokens)
    and stored there when a file is named. Says which layers it skips."""
    num_layers = len(target.model.layers)
    if skip_layers is not None:
        choice = SkipChoice(skip_layers, num_layers)
    elif calibration is not None and Path(calibration).exists():
        choice = SkipChoice.load(calibration)
        if choice.num_layers != num_layers:
            raise ValueError(f"self-speculation calibration file {calibration} was made for a "
                             f"target of {choice.num_layers} layers, this one has {num_layers}; "
                             "delete it or name another file to calibrate again")  # fmt: skip
        check_skip_layers(choice.skip_layers, num_layers, f"calibration file {calibration}:")
    else:
        say(f"verispec: calibrating self-speculation on {len(CALIBRATION_PROMPTS)} prompts ...")
        eos = set(target.tokenizer.eos_token_ids) | set(target.model.config.eos_token_ids)
        prompts = calibration_prompts(target.tokenizer)
        choice, _ = calibrate(target.model, prompts, eos, num_speculative_tokens)
        if calibration is not None:
            choice.save(calibration)
    say(f"verispec: {choice.describe()}")
    return SelfDraftProposer(choice, num_speculative_tokens, target)


def calibration_prompts(tokenizer: Tokenizer) -> list[list[int]]:
    """CALIBRATION_PROMPTS as token ids: chat turns when the tokenizer has a chat template."""
    if tokenizer.chat_template is None:
        return [tokenizer.encode(text) for text in CALIBRATION_PROMPTS]
    return [chat_prompt(tokenizer.hf, [{"role": "user", "content": text}], "the target")[1]
            for text in CALIBRATION_PROMPTS]  # fmt: skip
