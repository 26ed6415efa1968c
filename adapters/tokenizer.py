"""Tokens and text at the platform's edge (DeepServe runs the tokenizer apart from the engine).

Pluggable: `Tokenizer` is a protocol (encode / decode / name). Two implementations:

- `ApproxTokenizer` (the default): deterministic, about four characters a token. The text is cut
  into 4-character pieces from its start, and a piece's id is a keyed digest of the piece — so two
  prompts that share a text prefix share a token prefix (and hence the chain hashes of every full
  KV block inside it: they hit the prefix cache). No vocabulary file, same ids in every process.
- `HfTokenizer`: a Hugging Face `tokenizers` JSON file from a local path (optional dependency;
  nothing is downloaded).

Generated tokens are emulated ids (actors/flowserve/tokens.py derives them from the request's
seed); `token_text` renders one as a readable word, so a person watching a stream sees words
arrive at the emulated pace. `prompt_of_text` turns a prompt into the TE's `Prompt`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from deepserve.actors.flowserve.messages import Prompt
from deepserve.actors.flowserve.tokens import DEFAULT_VOCAB, chain_hashes_from_tokens, mix64

CHARS_PER_TOKEN = 4
MAX_TEXT_CHARS = 4 << 20  # a limit on everything: 4 MiB of prompt text
MAX_REMEMBERED = 1 << 16  # pieces whose ids (and ids whose pieces) a tokenizer keeps

# Words for the emulated output. Common English words, so a stream reads like (odd) prose.
WORDS = (
    "the of and to in is was that for on with as by at from this it an be are or his her which "
    "one all were they there their has been have more would will when some what into time about "
    "model token cache block prefill decode serve cluster memory compute signal river mountain "
    "light shadow garden window morning evening quiet bright simple careful gentle steady "
    "north south east west under over across between before after during within without "
    "system engine stream packet kernel actor message record replay event batch queue"
).split()


class Tokenizer(Protocol):
    name: str

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class ApproxTokenizer:
    """About four characters a token; ids are blake2b digests of the pieces, mod `vocab`."""

    def __init__(self, vocab: int = DEFAULT_VOCAB) -> None:
        if not isinstance(vocab, int) or vocab < 2:
            raise ValueError(f"vocab: must be an int >= 2, got {vocab!r}")
        self.vocab = vocab
        self.name = f"approx-{CHARS_PER_TOKEN}c"
        self._pieces: dict[int, str] = {}  # decode of ids this process encoded (bounded)
        self._ids: dict[str, int] = {}  # the id of each piece hashed (bounded)

    def encode(self, text: str) -> list[int]:
        """`encode_readable`, with each piece's id remembered (bounded): a piece is hashed once,
        not at every prompt holding it (the daemon tokenizes every request's prompt at its edge)."""
        if len(text) > MAX_TEXT_CHARS:
            raise ValueError(f"text: {len(text)} characters, limit {MAX_TEXT_CHARS}")
        ids, out = self._ids, []
        for i in range(0, len(text), CHARS_PER_TOKEN):
            piece = text[i : i + CHARS_PER_TOKEN]
            tid = ids.get(piece)
            if tid is None:
                tid = self._piece_id(piece)
                if len(ids) < MAX_REMEMBERED:
                    ids[piece] = tid
            out.append(tid)
        return out

    def encode_readable(self, text: str) -> list[int]:
        if len(text) > MAX_TEXT_CHARS:
            raise ValueError(f"text: {len(text)} characters, limit {MAX_TEXT_CHARS}")
        return [self._piece_id(text[i : i + CHARS_PER_TOKEN]) for i in range(0, len(text), CHARS_PER_TOKEN)]

    def _piece_id(self, piece: str) -> int:
        digest = hashlib.blake2b(piece.encode("utf-8", "surrogatepass"), digest_size=8).digest()
        tid = int.from_bytes(digest, "little") % self.vocab
        if len(self._pieces) < MAX_REMEMBERED:
            self._pieces.setdefault(tid, piece)
        return tid

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ids: a piece this tokenizer encoded, else the emulated word for the id."""
        return "".join(self._pieces.get(t) or token_text(t) for t in ids)


class HfTokenizer:
    """A Hugging Face `tokenizers` file (tokenizer.json) read from a local path."""

    def __init__(self, path: str) -> None:
        p = Path(path)  # the file first: a wrong path is the error to fix, whatever is installed
        if not p.exists():
            raise ValueError(f"tokenizer: {path}: no such file")
        if not p.is_file():
            raise ValueError(f"tokenizer: {path} is not a file")
        try:
            from tokenizers import Tokenizer as _Hf  # optional dependency
        except ImportError:
            raise ValueError(f"tokenizer: {path}: reading it needs the 'tokenizers' package, "
                             "not installed (pip install tokenizers)") from None  # fmt: skip
        try:
            self._tok: Any = _Hf.from_file(str(p))
        except Exception as exc:  # noqa: BLE001 — the library raises its own exception types
            raise ValueError(f"tokenizer: {path}: {exc}") from None
        self.name = f"hf:{p.name}"

    def encode(self, text: str) -> list[int]:
        if len(text) > MAX_TEXT_CHARS:
            raise ValueError(f"text: {len(text)} characters, limit {MAX_TEXT_CHARS}")
        return list(self._tok.encode(text).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids)))


def make_tokenizer(spec: str) -> Tokenizer:
    """"approx" (the default) or a path to a tokenizer.json."""
    if spec in ("", "approx"):
        return ApproxTokenizer()
    return HfTokenizer(spec)


def token_text(token_id: int) -> str:
    """The readable word of an emulated output token (a word and a space)."""
    return WORDS[mix64(token_id) % len(WORDS)] + " "  # mixed: ids in arithmetic runs read as prose


def output_text(token_ids: Sequence[int]) -> str:
    return "".join(token_text(t) for t in token_ids)


def prompt_of_text(tokenizer: Tokenizer, text: str, block_tokens: int) -> tuple[Prompt, list[int]]:
    """The TE's `Prompt` (token count + chain hashes of full blocks) and the token ids."""
    ids = tokenizer.encode(text)
    return prompt_of_ids(ids, block_tokens), ids


def prompt_of_ids(ids: Sequence[int], block_tokens: int) -> Prompt:
    """The TE's `Prompt` of a prompt given as token ids (OpenAI's token-array prompts)."""
    return Prompt(num_tokens=len(ids), block_hashes=chain_hashes_from_tokens(ids, block_tokens))


def chat_text(messages: Sequence[dict[str, str]]) -> str:
    """A plain chat template: one `role: content` line per message, then the assistant's turn.
    Equal conversation prefixes give equal text prefixes (multi-turn chats hit the cache)."""
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
