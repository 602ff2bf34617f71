"""Merge a LoRA adapter GGUF into its base model's GGUF, with numpy: no torch, no conversion script.

Try it (engine/gguf/chat.py) answers from a merged GGUF per checkpoint. Exporting
a merged model through torch and llama.cpp's converter takes about 12 s on
two cores; exporting the adapter alone (`sapling-node export --format
gguf-lora`) takes about 5 s, and merging it here into the base GGUF, which
the bundled model's conversion already made, 2-3 s (docs/exporting.md). llama.cpp could
apply the adapter at run time instead, but then every token costs a fifth
more (measured at 1 thread on SmolLM2-135M: 0.78 of the merged
model's tokens per second), which a person asking while training runs pays
in training time.

The adapter's tensors are already in the base GGUF's layout (the converter
permutes them as it permutes the base), so each targeted weight becomes
W + (alpha / rank) * B @ A, computed in float32 and stored in the base
tensor's type, which is what llama.cpp computes at run time with the
adapter applied at scale 1.
"""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Any

from engine.common.errors import SaplingError

LORA_A, LORA_B = ".lora_a", ".lora_b"
GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# GGUF metadata value types -> their size in bytes (8: string, 9: array, sized as they are read)
VALUE_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
PLAIN_TYPES = {0: "float32", 1: "float16"}  # GGML tensor types merged here: F32, F16


class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, fmt: str) -> Any:
        value = struct.unpack_from("<" + fmt, self.data, self.at)[0]
        self.at += struct.calcsize("<" + fmt)
        return value

    def string(self) -> bytes:
        length = self.take("Q")
        self.at += length
        return self.data[self.at - length:self.at]

    def skip_value(self, value_type: int) -> Any:
        """Step over one metadata value; returns it when it is a number (the alignment is one)."""
        if value_type == 8:
            self.string()
            return None
        if value_type == 9:
            item_type, count = self.take("I"), self.take("Q")
            if item_type in VALUE_SIZES:
                self.at += VALUE_SIZES[item_type] * count
            else:
                for _ in range(count):
                    self.skip_value(item_type)
            return None
        size = VALUE_SIZES.get(value_type)
        if size is None:
            raise ValueError(f"unknown metadata type {value_type}")
        fmt = {1: "B", 2: "H", 4: "I", 8: "Q"}[size]
        return self.take(fmt)


def tensor_table(path: Path) -> dict[str, tuple[int, tuple[int, ...], int]]:
    """A GGUF file's tensors: name -> (GGML type, numpy shape, byte offset in the file).

    Reads the header alone and steps over the metadata without decoding it, so a
    model with a 49k-token vocabulary is read in a fraction of a second (gguf-py's
    reader decodes every token and merge, several seconds on two cores).
    """
    with path.open("rb") as f:
        head = f.read(64 << 20)  # the header of a 135M-parameter model is about 3 MB
    cursor = _Cursor(head)
    if head[:4] != GGUF_MAGIC:
        raise ValueError("not a GGUF file")
    cursor.at = 4
    version, n_tensors, n_kv = cursor.take("I"), cursor.take("Q"), cursor.take("Q")
    if version < 2:
        raise ValueError(f"GGUF version {version} is too old")
    alignment = DEFAULT_ALIGNMENT
    for _ in range(n_kv):
        key = cursor.string()
        value = cursor.skip_value(cursor.take("I"))
        if key == b"general.alignment" and isinstance(value, int):
            alignment = value
    tensors = []
    for _ in range(n_tensors):
        name = cursor.string().decode()
        dims = tuple(cursor.take("Q") for _ in range(cursor.take("I")))
        tensors.append((name, cursor.take("I"), tuple(reversed(dims)), cursor.take("Q")))
    start = -(-cursor.at // alignment) * alignment
    return {name: (kind, shape, start + offset) for name, kind, shape, offset in tensors}


def merge_lora(base: Path, adapter: Path, out: Path) -> Path:
    """Write `out` (atomically): `base` with `adapter`'s LoRA deltas added to the weights it targets.

    The merged file is the base file with those tensors' bytes replaced (same
    shapes, same types), so it is a copy and an overwrite in place. Raises
    SaplingError with one sentence when either file is not what it should be.
    """
    import numpy as np
    from gguf import GGUFReader

    try:
        lora = GGUFReader(str(adapter))  # small: a few fields and the adapter's tensors
        table = tensor_table(base)
    except (OSError, ValueError, struct.error, IndexError) as exc:
        raise SaplingError(f"Could not read {base.name} or {adapter.name} as GGUF ({exc}).") from exc

    def field(key: str) -> Any:
        value = lora.fields.get(key)
        return None if value is None else value.contents()

    if field("general.type") != "adapter" or field("adapter.type") != "lora":
        raise SaplingError(f"{adapter.name} is not a LoRA adapter GGUF.")
    alpha = float(field("adapter.lora.alpha") or 0.0)
    pairs: dict[str, dict[str, Any]] = {}
    for tensor in lora.tensors:
        for suffix in (LORA_A, LORA_B):
            if tensor.name.endswith(suffix):
                pairs.setdefault(tensor.name.removesuffix(suffix), {})[suffix] = tensor.data
    for name, pair in pairs.items():
        if len(pair) != 2 or name not in table:
            raise SaplingError(f"{adapter.name} does not fit {base.name}: {name} has no matching weight.")
        kind, shape, _ = table[name]
        if kind not in PLAIN_TYPES:
            raise SaplingError(f"{base.name} stores {name} in GGML type {kind}; merging needs f16 or f32.")
        if (pair[LORA_B].shape[0], pair[LORA_A].shape[1]) != shape:
            raise SaplingError(f"{adapter.name} does not fit {base.name}: {name} has another shape.")

    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        shutil.copyfile(base, tmp)
        mapped = np.memmap(tmp, mode="r+")
        for name, pair in pairs.items():
            kind, shape, offset = table[name]
            weight = np.ndarray(shape, dtype=PLAIN_TYPES[kind], buffer=mapped, offset=offset)
            a = np.asarray(pair[LORA_A], dtype=np.float32)  # [rank, in]
            b = np.asarray(pair[LORA_B], dtype=np.float32)  # [out, rank]
            scale = alpha / a.shape[0] if alpha else 1.0  # as llama.cpp scales an adapter applied at 1.0
            weight[...] = (weight.astype(np.float32) + scale * (b @ a)).astype(weight.dtype)
        mapped.flush()
        del mapped
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out
