"""A tiny chat model built on the spot, so tests never need a model hub.

Two builders:

* ``build_tokenizer(dest)`` runs anywhere ``tokenizers`` is installed (the trimproxy
  venv has no transformers and no torch). It trains a byte-level BPE tokenizer on a
  deterministic local corpus and writes ``tokenizer.json``, ``tokenizer_config.json``
  and ``special_tokens_map.json`` by hand, in the shape transformers 4.x and 5.x both
  load as ``PreTrainedTokenizerFast``. The inline ``chat_template`` renders the very
  string FastChat 0.2.36 builds with ``--conv-template qwen-7b-chat`` (see
  ``FASTCHAT_TEMPLATE_NOTES``), so a counter that applies this template counts exactly
  FastChat's ``usage.prompt_tokens``.
* ``build_model(dest, python=None, shape=None)`` adds a randomly initialised tiny
  ``LlamaForCausalLM`` (config + safetensors weights) of the given ``ModelShape``
  (``FASTCHAT_SHAPE`` when none is given). torch lives only in the FastChat and vLLM
  venvs, so the weights are written by a subprocess running that venv's python.

Both are cached under ``<repo>/.cache/tiny-model/<key>/`` where the key hashes this
file's source (and the library versions and the model shape that shape the output), so
reruns are instant
and any change to the builders rebuilds. Results are deterministic: a fixed corpus, a
fixed seed.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = [
    "CHAT_TEMPLATE",
    "DEFAULT_SYSTEM_MESSAGE",
    "FASTCHAT_SHAPE",
    "MAX_POSITIONS",
    "MODEL_NAME",
    "SPECIAL_TOKENS",
    "ModelShape",
    "build_model",
    "build_tokenizer",
    "cache_root",
    "cached_model",
    "render_fastchat_prompt",
]

#: The name the FastChat worker serves the model under. Never "qwen...": FastChat picks
#: a model adapter by substring of the model path/name, and a Qwen adapter would load
#: the tokenizer and model differently.
MODEL_NAME = "tiny-chat"
#: The model's context window (``max_position_embeddings``); FastChat reads it as the
#: context length.
MAX_POSITIONS = 2048
VOCAB_SIZE = 4096
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
#: FastChat 0.2.36, conversation.py, template "qwen-7b-chat": system_message.
DEFAULT_SYSTEM_MESSAGE = "You are a helpful assistant."

FASTCHAT_TEMPLATE_NOTES = """
FastChat 0.2.36 builds the prompt in openai_api_server.get_gen_params:
  * every "system" message calls conv.set_system_message(content): the LAST system
    message wins, wherever it stands, and it is rendered first; with none, the
    template's default "You are a helpful assistant." is used;
  * "user"/"assistant" messages are appended in order; any other role raises;
  * a final (assistant, None) is appended: the generation prompt.
Conversation.get_prompt, SeparatorStyle.CHATML, system_template
"<|im_start|>system\\n{system_message}", sep "<|im_end|>":
  * "<|im_start|>system\\n" + system + "<|im_end|>\\n" (always: the formatted system
    template is never empty, even for an empty system message);
  * per message: role + "\\n" + content + "<|im_end|>\\n" when content is truthy,
    else role + "\\n" alone (an empty message renders like a generation prompt);
  * roles are "<|im_start|>user" and "<|im_start|>assistant".
The worker counts len(tokenizer(prompt).input_ids); this tokenizer adds no BOS/EOS.
"""

# The jinja below mirrors the notes above line by line. Non-string content is refused:
# FastChat's CHATML path only concatenates strings for assistants, and its list
# handling for users goes through an image-aware tuple that this template cannot mirror
# exactly; refusing is better than a count that silently differs.
CHAT_TEMPLATE = (
    "{%- set ns = namespace(system='" + DEFAULT_SYSTEM_MESSAGE + "') -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}"
    "{%- set ns.system = message['content'] -%}"
    "{%- elif message['role'] != 'user' and message['role'] != 'assistant' -%}"
    "{{- raise_exception('Unknown role: ' + message['role']) -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{{- '<|im_start|>system\\n' + ns.system + '<|im_end|>\\n' -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] != 'system' -%}"
    "{%- if message['content'] is not none and message['content'] is not string -%}"
    "{{- raise_exception('Only string message content is supported') -}}"
    "{%- endif -%}"
    "{%- if message['content'] -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- endif -%}"
)


def render_fastchat_prompt(messages: list[dict[str, str]]) -> str:
    """The prompt string FastChat 0.2.36 builds for ``messages`` (qwen-7b-chat).

    A plain-Python restatement of FastChat's code, for tests that check the jinja
    template against it without FastChat installed.
    """
    system = DEFAULT_SYSTEM_MESSAGE
    turns: list[tuple[str, str | None]] = []
    for message in messages:
        role = message["role"]
        if role == "system":
            system = message["content"]
        elif role in ("user", "assistant"):
            turns.append((f"<|im_start|>{role}", message["content"]))
        else:
            raise ValueError(f"Unknown role: {role}")
    turns.append(("<|im_start|>assistant", None))
    out = f"<|im_start|>system\n{system}<|im_end|>\n"
    for role_tag, content in turns:
        out += f"{role_tag}\n{content}<|im_end|>\n" if content else f"{role_tag}\n"
    return out


# --------------------------------------------------------------------------- corpus

_PASSAGE = """\
The proxy keeps every chat prompt inside a token budget. When a conversation grows past
the budget, the oldest turns are dropped, whole turns only, and the system prompt stays.
Operators watch the memory of the inference server rise and fall with the prompts.
A user asks a question; the assistant answers; the next question builds on the answer.
Sessions end after too many turns or too much time, and a new session starts small.
Numbers such as 0, 1, 2, 3, 10, 42, 100, 512, 1024, 2048 and 4096 appear in logs.
Punctuation matters: commas, periods. Questions? Answers! Quotes "like this" and 'this'.
Code looks like def count(messages): return sum(len(m) for m in messages) # tokens
JSON looks like {"role": "user", "content": "hello"} and [1, 2, 3].
"""

# Prose reads better than a list literal here.
_WORDS = (  # noqa: SIM905
    "the a an and or but if then when while because so of to in on at by for with from "
    "about into over under after before between through during without within across "
    "I you he she it we they me him her us them my your his its our their this that "
    "these those who what which where why how is are was were be been being have has "
    "had do does did will would can could should may might must shall say said tell "
    "ask answer question reply turn message prompt token budget context window model "
    "server proxy client request response stream chunk session limit reset trim drop "
    "keep count memory cache prefix system user assistant tool call result error code "
    "time day night morning evening week year today tomorrow yesterday now later soon "
    "good bad new old big small long short high low first last next other same many "
    "few more most less least very much quite rather just only also even still again "
    "people person friend family city country world house room door window table chair "
    "book page line word letter number name story idea plan work job team project task "
    "water food coffee tea bread apple river mountain tree flower garden road car train "
    "run walk read write speak listen think know learn teach help need want like love "
    "make take give get put set go come see look find show try start stop open close "
    "red green blue black white bright dark warm cold quick slow easy hard simple clear "
    "please thanks sorry hello yes no maybe sure okay great fine well right wrong true"
).split()


_SYLLABLES = (  # noqa: SIM905
    "ka lo mi ne ru sa ti vo ze pa qu bri den fal gor hin jus kel mor nax pel "
    "rin sol tar ulm ven wix yor zan ash bel cor dra eth fin gal hal ith jor"
).split()


def _pseudo_words(rng: random.Random, count: int) -> list[str]:
    # Made-up words widen the vocabulary towards VOCAB_SIZE the way names and rare
    # words do in real text.
    return ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4))) for _ in range(count)]


def _corpus(seed: int = 1234, sentences: int = 12000) -> Iterator[str]:
    """A deterministic training corpus: a fixed passage plus seeded random sentences.

    ``random.Random(int)`` and its ``choice``/``randint`` are stable across CPython 3
    releases, so every machine trains on the same text.
    """
    yield from _PASSAGE.splitlines()
    rng = random.Random(seed)
    vocabulary = list(_WORDS) * 4 + _pseudo_words(rng, 3000)
    for index in range(sentences):
        length = rng.randint(4, 18)
        words = [rng.choice(vocabulary) for _ in range(length)]
        words[0] = words[0].capitalize()
        end = rng.choice([".", ".", ".", "?", "!"])
        extra = f" {index % 977}" if index % 7 == 0 else ""
        yield " ".join(words) + extra + end


# --------------------------------------------------------------------------- caching


def cache_root() -> Path:
    """``$TRIMPROXY_TEST_CACHE`` or ``<repo>/.cache`` (git-ignored)."""
    env = os.environ.get("TRIMPROXY_TEST_CACHE")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / ".cache"


def _source_key(*extra: str) -> str:
    digest = hashlib.sha256(Path(__file__).read_bytes())
    for item in extra:
        digest.update(b"\0" + item.encode())
    return digest.hexdigest()[:16]


def _publish(build_dir: Path, final: Path) -> None:
    """Move a finished build into place atomically; a concurrent winner is kept."""
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(build_dir, final)
    except OSError:
        if not final.is_dir():
            raise
        shutil.rmtree(build_dir, ignore_errors=True)


def _copy_files(src: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.is_file():
            shutil.copy2(item, dest / item.name)


# --------------------------------------------------------------------------- tokenizer


def _tokenizer_config() -> dict[str, object]:
    added = {
        str(index): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for index, token in enumerate(SPECIAL_TOKENS)
    }
    # Loadable by transformers 4.x and 5.x alike: an explicit fast tokenizer class
    # (no slow-tokenizer files exist) and the chat template inline, not in a separate
    # chat_template.jinja that 4.x would not read.
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POSITIONS,
        "chat_template": CHAT_TEMPLATE,
    }


def _special_tokens_map() -> dict[str, object]:
    return {
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
    }


def _train_tokenizer(out_dir: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    # Byte-level: every string encodes (no unknown tokens), like GPT-2/Qwen tokenizers.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    # Offsets only; adds no BOS/EOS, so len(tokenizer(prompt)) is the template's count.
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(_tokenizer_config(), indent=2, ensure_ascii=False) + "\n"
    )
    (out_dir / "special_tokens_map.json").write_text(
        json.dumps(_special_tokens_map(), indent=2) + "\n"
    )


def _tokenizer_cache_dir() -> Path:
    import tokenizers

    # The trained merges may differ between tokenizers releases, so the version is
    # part of the key.
    return cache_root() / "tiny-model" / _source_key("tokenizers", tokenizers.__version__)


def build_tokenizer(dest: Path) -> Path:
    """Write the tiny chat tokenizer's files into ``dest`` (created) and return ``dest``.

    Files: ``tokenizer.json``, ``tokenizer_config.json`` (with ``chat_template``),
    ``special_tokens_map.json``. ``AutoTokenizer.from_pretrained(dest)`` loads it.
    """
    dest = Path(dest)
    cached = _tokenizer_cache_dir() / "tokenizer"
    if not (cached / "tokenizer_config.json").is_file():
        cached.parent.mkdir(parents=True, exist_ok=True)
        build_dir = Path(tempfile.mkdtemp(prefix="tokenizer.", dir=cached.parent))
        _train_tokenizer(build_dir)
        _publish(build_dir, cached)
    _copy_files(cached, dest)
    return dest


# --------------------------------------------------------------------------- model


@dataclass(frozen=True)
class ModelShape:
    """The architecture of a tiny random ``LlamaForCausalLM``; the vocabulary is the tokenizer's.

    The defaults are the vLLM stack's model: vLLM's CPU attention backend rejects
    head_dim 16, and one KV head (GQA 2:1) keeps the KV cache small per token
    (``2 * layers * kv_heads * head_dim * 2`` bytes in bf16 = 512 B). ``hidden`` need not
    equal ``heads * head_dim``: Llama projects to ``heads * head_dim`` and back.
    """

    layers: int = 2
    hidden: int = 128
    heads: int = 2
    kv_heads: int = 1
    head_dim: int = 64
    intermediate: int = 256
    max_position: int = 4096
    #: A ``torch`` dtype name: "bfloat16", "float16" or "float32".
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        if self.heads % self.kv_heads:
            raise ValueError(
                f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})"
            )
        if self.dtype not in ("bfloat16", "float16", "float32"):
            raise ValueError(f"dtype must be bfloat16, float16 or float32, not {self.dtype!r}")

    def key(self) -> str:
        """A short, readable name for the cache directory."""
        return (
            f"l{self.layers}-h{self.hidden}-a{self.heads}-kv{self.kv_heads}-d{self.head_dim}"
            f"-i{self.intermediate}-p{self.max_position}-{self.dtype}"
        )


#: The FastChat stack's model (what ``build_model`` builds when no shape is given):
#: transformers on CPU runs any head_dim, and float32 is what FastChat's CPU path loads.
FASTCHAT_SHAPE = ModelShape(
    layers=2,
    hidden=64,
    heads=4,
    kv_heads=4,
    head_dim=16,
    intermediate=128,
    max_position=MAX_POSITIONS,
    dtype="float32",
)

# Runs inside the FastChat or vLLM venv (torch + transformers 4.x or 5.x). argv: dest,
# vocab size, the shape as JSON, special token ids (endoftext, im_start, im_end).
_MODEL_SCRIPT = r"""
import json
import sys
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

dest, vocab, shape = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
pad_id, bos_id, eos_id = (int(x) for x in sys.argv[4:7])
# transformers 5 renamed the config's torch_dtype to dtype.
dtype_key = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=vocab,
    hidden_size=shape["hidden"],
    intermediate_size=shape["intermediate"],
    num_hidden_layers=shape["layers"],
    num_attention_heads=shape["heads"],
    num_key_value_heads=shape["kv_heads"],
    head_dim=shape["head_dim"],
    max_position_embeddings=shape["max_position"],
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    pad_token_id=pad_id,
    bos_token_id=bos_id,
    eos_token_id=eos_id,
    **{dtype_key: shape["dtype"]},
)
model = LlamaForCausalLM(config).to(getattr(torch, shape["dtype"]))
model.eval()
model.save_pretrained(dest, safe_serialization=True)
"""


def _model_cache_dir(python: Path, shape: ModelShape) -> Path:
    # The venv's pin marker (written by ensure_fastchat_env / ensure_vllm_env) names the
    # torch/transformers that wrote the weights.
    marker = python.parent.parent / "trimproxy-pins.txt"
    pins = marker.read_text() if marker.is_file() else str(python)
    key = _source_key("model", pins, _tokenizer_cache_dir().name, json.dumps(asdict(shape)))
    return _tokenizer_cache_dir().parent / f"{key}-{shape.key()}"


def cached_model(python: Path, shape: ModelShape | None = None) -> Path:
    """Build (once per shape and venv) and return the cached model folder itself.

    For servers that only read the folder (vLLM): no copy per caller. Callers must not
    write into it.
    """
    shape = FASTCHAT_SHAPE if shape is None else shape
    cached = _model_cache_dir(python, shape) / MODEL_NAME
    if (cached / "config.json").is_file():
        return cached
    cached.parent.mkdir(parents=True, exist_ok=True)
    build_dir = Path(tempfile.mkdtemp(prefix="model.", dir=cached.parent))
    build_tokenizer(build_dir)
    # The tokenizer's own limit follows the model's window, so that transformers does
    # not warn about prompts the model accepts.
    config_path = build_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["model_max_length"] = shape.max_position
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    vocab = json.loads((build_dir / "tokenizer.json").read_text())
    size = len(vocab["model"]["vocab"])
    ids = {tok["content"]: tok["id"] for tok in vocab["added_tokens"]}
    special_ids = [str(ids[token]) for token in SPECIAL_TOKENS]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    for key in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"):
        # The caller's venv must not leak into the other venv's interpreter.
        env.pop(key, None)
    subprocess.run(
        [
            str(python),
            "-c",
            _MODEL_SCRIPT,
            str(build_dir),
            str(size),
            json.dumps(asdict(shape)),
            *special_ids,
        ],
        check=True,
        env=env,
    )
    _publish(build_dir, cached)
    return cached


def build_model(dest: Path, python: Path | None = None, shape: ModelShape | None = None) -> Path:
    """Write the tiny model (tokenizer, config, safetensors weights) into ``dest``.

    ``python`` is an interpreter with torch and transformers; by default the FastChat
    venv (built on demand). ``shape`` defaults to ``FASTCHAT_SHAPE``; each shape is
    cached on its own. Returns ``dest``. Do not name ``dest`` with "qwen" or any
    other model family FastChat matches by name.
    """
    if python is None:
        from tests.support.fastchat_stack import ensure_fastchat_env

        python = ensure_fastchat_env() / "bin" / "python"
    dest = Path(dest)
    _copy_files(cached_model(python, shape), dest)
    return dest


if __name__ == "__main__":  # pragma: no cover - manual use: build into a folder
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "tiny-chat")
    print(build_tokenizer(target) if "--tokenizer-only" in sys.argv else build_model(target))
