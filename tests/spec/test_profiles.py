"""The start-up profile of target steps, kept in the cache per model, settings and machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.checkpoints import SPEC_PAIRS
from verispec import LLM, SpecConfig
from verispec.spec import profiles

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: a second thread only waits


def adaptive(target: Path, draft: Path, **engine: object) -> dict[int, float]:
    spec = SpecConfig(model=str(draft), num_speculative_tokens=2, adaptive=True)
    llm = LLM(model=str(target), speculative=spec, **engine)
    assert llm.engine.spec_policy is not None
    return dict(llm.engine.spec_policy.cost.profile)


@pytest.mark.parametrize("spec_pair", [SPEC_PAIRS[0]], indirect=True, ids=["llama"])
def test_a_later_load_reuses_the_profile_and_other_settings_measure_again(
    spec_pair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    target, draft = spec_pair
    first = adaptive(target, draft)
    assert set(first) == {1, 2, 4, 8, 16} and (tmp_path / "kernels" / "profiles.json").is_file()
    assert adaptive(target, draft) == first  # timed floats: equal only when reused
    other = adaptive(target, draft, quantization="fp16")  # other kernels: measured anew
    assert set(other) == set(first) and other != first
    assert adaptive(target, draft) == first  # both kept


@pytest.mark.parametrize("spec_pair", [SPEC_PAIRS[0]], indirect=True, ids=["llama"])
def test_a_broken_or_full_cache_only_means_measuring_again(
    spec_pair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "profiles.json").write_text("{not json")
    target, draft = spec_pair
    first = adaptive(target, draft)
    assert first and adaptive(target, draft) == first
    monkeypatch.setattr(profiles, "MAX_ENTRIES", 1)
    for i in range(3):
        profiles.store({"other": i}, {1: 0.5})
    assert profiles.load({"other": 2}) == {1: 0.5} and profiles.load({"other": 0}) is None
    assert adaptive(target, draft) != first  # pushed out: measured again
