"""Hugging Face interop: config.json, safetensors weights, tokenizer.json and chat templates, in and out.

Loading reads each tensor lazily with safetensors' ``safe_open`` and places it with
``jax.make_array_from_callback``: every device's callback reads only that device's slice (a slice of the
memory-mapped file, transposed from HF's ``[out, in]`` to our ``[in, out]``), so no full host copy of the
model is built per device. Layers are stacked on the fly. Export writes the same HF layout
(``model.safetensors`` or shards + ``model.safetensors.index.json``) that ``transformers`` loads.

Import and export share one module (~410 lines): the name mapping and the transposes must be each other's
inverse, and keeping them side by side is how they stay so.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from esjax.errors import EsjaxError
from esjax.es.noise import path_str
from esjax.model.config import ModelConfig, ModelConfigError, from_hf_dict, to_hf_dict
from esjax.model.params import param_shapes
from esjax.model.sharding import param_shardings

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
#: Files copied verbatim from the source checkpoint on export.
TOKENIZER_FILES = (TOKENIZER_FILE, TOKENIZER_CONFIG_FILE, "special_tokens_map.json", "generation_config.json",
                   CHAT_TEMPLATE_FILE, "chat_template.json", "vocab.json", "merges.txt", "added_tokens.json",
                   "tokenizer.model")


class ModelFileError(EsjaxError, ValueError):
    """A missing or malformed checkpoint file or tensor (names the file and key)."""


# ---------------------------------------------------------------------------------------------------------
# config.json
# ---------------------------------------------------------------------------------------------------------


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ModelFileError(f"{path}: file not found")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as err:
        raise ModelFileError(f"{path}: invalid JSON ({err})") from err
    except (UnicodeDecodeError, OSError) as err:
        raise ModelFileError(f"{path}: cannot be read as JSON text ({err.__class__.__name__})") from err
    if not isinstance(data, dict):
        raise ModelFileError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def read_config(model_dir: str | os.PathLike) -> tuple[ModelConfig, dict[str, Any]]:
    """``(ModelConfig, raw dict)`` from ``model_dir/config.json``."""
    path = Path(model_dir) / CONFIG_FILE
    raw = _read_json(path)
    return from_hf_dict(raw, source=str(path)), raw


# ---------------------------------------------------------------------------------------------------------
# Parameter path <-> HF tensor names
# ---------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _TensorMap:
    name: str          # HF name; '{i}' is the layer index for stacked leaves
    transpose: bool    # HF stores linear weights [out, in]
    stacked: bool


def hf_tensor_map(config: ModelConfig) -> dict[str, _TensorMap]:
    """Our parameter path → HF tensor name (and layout) for every leaf of ``config``."""
    out: dict[str, _TensorMap] = {}
    for kp, _ in jax.tree_util.tree_flatten_with_path(param_shapes(config))[0]:
        path = path_str(kp)
        parts = path.split("/")
        if path == "embed/embedding":
            out[path] = _TensorMap("model.embed_tokens.weight", False, False)
        elif path == "final_norm/scale":
            out[path] = _TensorMap("model.norm.weight", False, False)
        elif path == "lm_head/kernel":
            out[path] = _TensorMap("lm_head.weight", True, False)
        elif parts[1] == "input_norm":
            out[path] = _TensorMap("model.layers.{i}.input_layernorm.weight", False, True)
        elif parts[1] == "post_attn_norm":
            out[path] = _TensorMap("model.layers.{i}.post_attention_layernorm.weight", False, True)
        else:
            block = "self_attn" if parts[1] == "attn" else "mlp"
            leaf = "weight" if parts[3] == "kernel" else "bias"
            out[path] = _TensorMap(f"model.layers.{{i}}.{block}.{parts[2]}.{leaf}", parts[3] == "kernel", True)
    return out


# ---------------------------------------------------------------------------------------------------------
# Reading safetensors
# ---------------------------------------------------------------------------------------------------------


class SafetensorsReader:
    """Lazy access to the tensors of a single-file or sharded (indexed) safetensors checkpoint."""

    def __init__(self, model_dir: str | os.PathLike):
        from safetensors import safe_open

        self.dir = Path(model_dir)
        index_path = self.dir / WEIGHTS_INDEX_FILE
        single = self.dir / WEIGHTS_FILE
        if index_path.is_file():
            index = _read_json(index_path)
            weight_map = index.get("weight_map")
            if not isinstance(weight_map, Mapping):
                raise ModelFileError(f"{index_path}: missing key 'weight_map'")
            self.source = index_path
            self.weight_map = dict(weight_map)
        elif single.is_file():
            self.source = single
            self.weight_map = None
        else:
            raise ModelFileError(f"{self.dir}: neither {WEIGHTS_FILE} nor {WEIGHTS_INDEX_FILE} found")
        self._open = safe_open
        self._handles: dict[str, Any] = {}
        self._names: dict[str, set[str]] = {}

    def _handle(self, file: str):
        if file not in self._handles:
            path = self.dir / file
            if not path.is_file():
                raise ModelFileError(f"{self.source}: refers to {file}, which does not exist in {self.dir}")
            try:
                handle = self._open(str(path), framework="np")
            except Exception as err:  # noqa: BLE001 - SafetensorError and friends: a corrupt header
                raise ModelFileError(f"{path}: not a valid safetensors file ({_first_line(err)})") from err
            self._handles[file] = handle
            self._names[file] = set(handle.keys())
        return self._handles[file]

    def _file_of(self, name: str) -> str:
        if self.weight_map is None:
            return WEIGHTS_FILE
        if name not in self.weight_map:
            raise ModelFileError(f"{self.source}: weight_map has no key {name!r}")
        return self.weight_map[name]

    def has(self, name: str) -> bool:
        if self.weight_map is not None:
            return name in self.weight_map
        self._handle(WEIGHTS_FILE)
        return name in self._names[WEIGHTS_FILE]

    def get_slice(self, name: str):
        file = self._file_of(name)
        handle = self._handle(file)
        if name not in self._names[file]:
            raise ModelFileError(f"{self.dir / file}: missing tensor {name!r}")
        return handle.get_slice(name)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.get_slice(name).get_shape())


def _normalize(index: Sequence[slice] | None, shape: Sequence[int]) -> list[slice]:
    index = tuple(index or ())
    index = index + (slice(None),) * (len(shape) - len(index))
    out = []
    for s, n in zip(index, shape):
        start, stop, step = s.indices(n)
        if step != 1:
            raise ValueError(f"strided shard slices are not supported: {s}")
        out.append(slice(start, stop))
    return out


def _leaf_callback(reader: SafetensorsReader, tmap: _TensorMap, shape: Sequence[int],
                   np_dtype: np.dtype) -> Callable[[Any], np.ndarray]:
    def read(name: str, idx: list[slice]) -> np.ndarray:
        if tmap.transpose:
            return np.asarray(reader.get_slice(name)[idx[1], idx[0]]).T
        return np.asarray(reader.get_slice(name)[tuple(idx)])

    def callback(index):
        idx = _normalize(index, shape)
        if tmap.stacked:
            layers = range(idx[0].start, idx[0].stop)
            arr = np.stack([read(tmap.name.format(i=i), idx[1:]) for i in layers])
        else:
            arr = read(tmap.name, idx)
        return np.ascontiguousarray(arr.astype(np_dtype))

    return callback


def load_params(model_dir: str | os.PathLike, config: ModelConfig | None = None, mesh: jax.sharding.Mesh | None = None,
                dtype: Any = None) -> Any:
    """Read the weights of an HF checkpoint into our parameter tree, straight into the target shardings.

    ``mesh``: shard by ``esjax.model.sharding`` rules (None: the default device). ``dtype``: parameter dtype
    (default ``config.dtype``, i.e. the checkpoint's ``dtype`` / ``torch_dtype``).
    """
    if config is None:
        config, _ = read_config(model_dir)
    reader = SafetensorsReader(model_dir)
    shapes = param_shapes(config, dtype)
    tmaps = hf_tensor_map(config)
    if mesh is None:
        device_sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        shardings = jax.tree.map(lambda _: device_sharding, shapes)
    else:
        shardings = param_shardings(config, mesh)

    def load(kp, struct, sharding):
        path = path_str(kp)
        tmap = tmaps[path]
        names = [tmap.name.format(i=i) for i in range(config.num_layers)] if tmap.stacked else [tmap.name]
        per_tensor = tuple(struct.shape[1:] if tmap.stacked else struct.shape)
        expected = per_tensor[::-1] if tmap.transpose else per_tensor
        for name in names:
            got = reader.shape(name)
            if got != tuple(expected):
                raise ModelFileError(f"{reader.source}: tensor {name!r} has shape {list(got)}, expected "
                                      f"{list(expected)} from {CONFIG_FILE}")
        cb = _leaf_callback(reader, tmap, struct.shape, np.dtype(struct.dtype))
        return jax.make_array_from_callback(struct.shape, sharding, cb, dtype=struct.dtype)

    return jax.tree_util.tree_map_with_path(load, shapes, shardings)


# ---------------------------------------------------------------------------------------------------------
# Tokenizer and chat template
# ---------------------------------------------------------------------------------------------------------


def load_tokenizer(model_dir: str | os.PathLike):
    """``tokenizers.Tokenizer`` from ``model_dir/tokenizer.json``."""
    from tokenizers import Tokenizer

    path = Path(model_dir) / TOKENIZER_FILE
    if not path.is_file():
        raise ModelFileError(f"{path}: file not found")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as err:  # noqa: BLE001 - the tokenizers library raises a bare Exception
        raise ModelFileError(f"{path}: not a valid tokenizer file ({_first_line(err)})") from err


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{err.__class__.__name__}: {text[0][:200]}" if text else err.__class__.__name__


def _token_text(value: Any) -> str | None:
    if isinstance(value, Mapping):
        return value.get("content")
    return value


def load_tokenizer_config(model_dir: str | os.PathLike) -> dict[str, Any]:
    path = Path(model_dir) / TOKENIZER_CONFIG_FILE
    return _read_json(path) if path.is_file() else {}


def load_chat_template(model_dir: str | os.PathLike) -> str | None:
    """The chat template: ``chat_template.jinja`` or ``tokenizer_config.json['chat_template']`` (None if neither)."""
    model_dir = Path(model_dir)
    jinja = model_dir / CHAT_TEMPLATE_FILE
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = load_tokenizer_config(model_dir).get("chat_template")
    if isinstance(template, list):  # [{'name': 'default', 'template': ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        if "default" not in named:
            raise ModelFileError(f"{model_dir / TOKENIZER_CONFIG_FILE}: chat_template list has no 'default' entry")
        template = named["default"]
    return template


def render_chat(template: str, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                **variables: Any) -> str:
    """Render a HF chat template with jinja2, in the same sandboxed environment transformers uses."""
    return _compiled_chat_template(template).render(messages=list(messages),
                                                    add_generation_prompt=add_generation_prompt, **variables)


@functools.lru_cache(maxsize=16)
def _compiled_chat_template(template: str) -> Any:
    """The compiled template (generate mode renders a prompt every turn; compiling it each time cost ~2.5 ms)."""
    import datetime

    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env.from_string(template)


@dataclasses.dataclass
class Pretrained:
    """Everything loaded from an HF folder."""

    config: ModelConfig
    params: Any
    tokenizer: Any
    chat_template: str | None
    raw_config: dict[str, Any]
    special_tokens: dict[str, str | None]
    path: Path

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                            **variables: Any) -> str:
        if self.chat_template is None:
            raise ModelFileError(f"{self.path}: no chat template ({CHAT_TEMPLATE_FILE} or "
                                  f"{TOKENIZER_CONFIG_FILE}['chat_template'])")
        return render_chat(self.chat_template, messages, add_generation_prompt, **self.special_tokens, **variables)


def load_pretrained(model_dir: str | os.PathLike, mesh: jax.sharding.Mesh | None = None, dtype: Any = None,
                    tokenizer: bool = True) -> Pretrained:
    """Config, params (sharded onto ``mesh``), tokenizer and chat template of an HF folder."""
    model_dir = Path(model_dir)
    config, raw = read_config(model_dir)
    if dtype is not None:
        config = config.replace(dtype=str(np.dtype(dtype)) if np.dtype(dtype).name != "bfloat16" else "bfloat16")
    params = load_params(model_dir, config, mesh, dtype)
    tok_cfg = load_tokenizer_config(model_dir)
    special = {k: _token_text(tok_cfg.get(k)) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
    return Pretrained(config, params, load_tokenizer(model_dir) if tokenizer else None, load_chat_template(model_dir),
                      raw, special, model_dir)


# ---------------------------------------------------------------------------------------------------------
# Export
# ---------------------------------------------------------------------------------------------------------


def _hf_tensors(config: ModelConfig, params: Any, np_dtype: np.dtype):
    """Yield ``(hf_name, numpy array)`` for every tensor, one leaf at a time (gathered to host)."""
    tmaps = hf_tensor_map(config)
    for kp, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        path = path_str(kp)
        if path not in tmaps:
            raise ModelFileError(f"export: parameter {path!r} has no Hugging Face name")
        tmap = tmaps[path]
        host = np.asarray(jax.device_get(leaf)).astype(np_dtype)
        slices = [(tmap.name.format(i=i), host[i]) for i in range(host.shape[0])] if tmap.stacked \
            else [(tmap.name, host)]
        for name, arr in slices:
            yield name, np.ascontiguousarray(arr.T if tmap.transpose else arr)


def export_pretrained(out_dir: str | os.PathLike, config: ModelConfig, params: Any, *,
                      source_dir: str | os.PathLike | None = None, raw_config: Mapping[str, Any] | None = None,
                      dtype: Any = None, max_shard_bytes: int = 4 << 30) -> Path:
    """Write ``params`` as an HF folder that ``transformers`` loads.

    Writes ``config.json`` (``raw_config``'s extra keys kept), ``model.safetensors`` (or shards of at most
    ``max_shard_bytes`` + ``model.safetensors.index.json``) and copies tokenizer / generation files from
    ``source_dir``. ``dtype``: storage dtype (default: the params' dtype).
    """
    from safetensors.numpy import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    leaf_dtype = jax.tree.leaves(params)[0].dtype
    np_dtype = np.dtype(dtype or leaf_dtype)
    dtype_name = "bfloat16" if np_dtype.name == "bfloat16" else np_dtype.name
    if source_dir is not None and raw_config is None and (Path(source_dir) / CONFIG_FILE).is_file():
        _, raw_config = read_config(source_dir)
    try:
        hf_config = to_hf_dict(config.replace(dtype=dtype_name), raw_config)
    except ModelConfigError as err:
        raise ModelFileError(f"export: {err}") from err

    shards: list[dict[str, np.ndarray]] = [{}]
    sizes = [0]
    for name, arr in _hf_tensors(config, params, np_dtype):
        if sizes[-1] and sizes[-1] + arr.nbytes > max_shard_bytes:
            shards.append({})
            sizes.append(0)
        shards[-1][name] = arr
        sizes[-1] += arr.nbytes
    for stale in (WEIGHTS_FILE, WEIGHTS_INDEX_FILE):
        if (out / stale).exists():
            (out / stale).unlink()
    def save(tensors: dict, path: Path) -> None:
        # safetensors writes through a private temporary file (mode 600); give the weights the mode every other
        # file of the folder gets (0666 less the umask), so whoever can read the folder can load the model.
        save_file(tensors, str(path), metadata={"format": "pt"})
        umask = os.umask(0)
        os.umask(umask)
        path.chmod(0o666 & ~umask)

    if len(shards) == 1:
        save(shards[0], out / WEIGHTS_FILE)
    else:
        weight_map = {}
        for i, shard in enumerate(shards):
            file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save(shard, out / file)
            weight_map.update({name: file for name in shard})
        index = {"metadata": {"total_size": int(sum(sizes))}, "weight_map": weight_map}
        (out / WEIGHTS_INDEX_FILE).write_text(json.dumps(index, indent=2), encoding="utf-8")
    (out / CONFIG_FILE).write_text(json.dumps(hf_config, indent=2, sort_keys=True), encoding="utf-8")
    if source_dir is not None:
        for file in TOKENIZER_FILES:
            src = Path(source_dir) / file
            if src.is_file() and src.resolve() != (out / file).resolve():
                shutil.copyfile(src, out / file)
    return out
