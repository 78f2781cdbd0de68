"""Loading a GGUF never builds the float32 model: a fresh process that loads a synthetic
~190 MB Q4_0 file and runs a forward grows by about the file's size, not the 1.3 GB its
weights take in float32."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from tests.helpers.checkpoints import CORPUS
from tests.helpers.gguf_files import _add_tokenizer
from verispec.models.kernels.backends import native_usable
from verispec.train.tokenizer import train_bpe_tokenizer

HIDDEN, FFN, LAYERS, VOCAB = 1024, 4096, 16, 320

CHILD = """
import json, resource, sys, torch
from pathlib import Path
from verispec.models.weights.loader import load_model
torch.set_num_threads(1)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
model = load_model(Path(sys.argv[1]), torch.float32, torch.device("cpu"))
x = model.embed.index_select(0, torch.tensor([1, 2, 3]))
assert torch.isfinite(x).all()
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"before": before, "after": after}))
"""


def q4_0_blocks(rows: int, columns: int, rng: np.random.Generator) -> np.ndarray:
    """Random Q4_0 blocks [rows, columns / 32 * 18] with d = 0.01 in every block."""
    blocks = rng.integers(0, 256, (rows, columns // 32, 18), dtype=np.uint8)
    blocks[:, :, :2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    return blocks.reshape(rows, -1)


def write_big_gguf(path: Path) -> int:
    """A llama GGUF of LAYERS layers of Q4_0 weights; returns the bytes of its weights."""
    writer = gguf.GGUFWriter(str(path), "llama")
    for add, value in ((writer.add_context_length, 256), (writer.add_embedding_length, HIDDEN),
                       (writer.add_feed_forward_length, FFN), (writer.add_block_count, LAYERS),
                       (writer.add_head_count, 8), (writer.add_head_count_kv, 8),
                       (writer.add_vocab_size, VOCAB)):  # fmt: skip
        add(value)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    _add_tokenizer(writer, train_bpe_tokenizer(CORPUS, vocab_size=VOCAB))
    rng = np.random.default_rng(0)
    shapes = {"attn_q": (HIDDEN, HIDDEN), "attn_k": (HIDDEN, HIDDEN), "attn_v": (HIDDEN, HIDDEN),
              "attn_output": (HIDDEN, HIDDEN), "ffn_gate": (FFN, HIDDEN),
              "ffn_up": (FFN, HIDDEN), "ffn_down": (HIDDEN, FFN)}  # fmt: skip
    total = 0
    q4 = gguf.GGMLQuantizationType.Q4_0
    for name, (rows, columns) in (("token_embd", (VOCAB, HIDDEN)), ("output", (VOCAB, HIDDEN))):
        data = q4_0_blocks(rows, columns, rng)
        writer.add_tensor(f"{name}.weight", data, raw_dtype=q4)
        total += data.nbytes
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    for layer in range(LAYERS):
        for name, (rows, columns) in shapes.items():
            data = q4_0_blocks(rows, columns, rng)
            writer.add_tensor(f"blk.{layer}.{name}.weight", data, raw_dtype=q4)
            total += data.nbytes
        for norm in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"blk.{layer}.{norm}.weight", np.ones(HIDDEN, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return total


@pytest.mark.skipif(not native_usable(), reason="the native kernel cannot run here: quantized "
                    "weights then run as float32 by design")  # fmt: skip
def test_loading_grows_by_about_the_file_not_the_float32_model(tmp_path: Path) -> None:
    path = tmp_path / "big.gguf"
    weight_bytes = write_big_gguf(path)
    float32_bytes = weight_bytes / 18 * 32 * 4
    env = {**os.environ, "VERISPEC_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True,
                          text=True, timeout=600, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rss = json.loads(done.stdout.strip().splitlines()[-1])
    grown = rss["after"] - rss["before"]
    # packed 4-bit codes take 0.625 bytes a weight against the file's 0.5625; the rest is one
    # tensor's decoding at a time, the arena and the runtime's own allocations
    assert grown < 1.6 * weight_bytes + 150e6, (grown / 1e6, weight_bytes / 1e6)
    assert grown < float32_bytes / 3, (grown / 1e6, float32_bytes / 1e6)
