"""Tokenization with Hugging Face `tokenizers`, from a package's own tokenizer.json.

Padding and truncation baked into tokenizer.json are switched off on load
(MiniLM's file pads every input to 128 tokens and truncates at 128): each batch is
padded here on the right, with an attention mask, to its own longest request or to the
longer length the engine asks for (its batch shapes on a GPU, vsr.runtime.engine).

Over-long requests are *refused*, not truncated: a router that silently drops
the end of a request can route it on half a sentence, so `encode_each` reports a
text with more tokens than the model's limit and the engine refuses to answer it.
The limit is, in order: config["vsr_max_tokens"], sentence-transformers'
max_seq_length (sentence_bert_config.json, the length the encoder was trained
and is served at), config["max_position_embeddings"] (a config that wraps its text
model's fields in text_config, as Qwen3.5's model_type "qwen3_5" does, gives it there).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer

from vsr.runtime.errors import PackageError, RequestError, read_json_object


@dataclass
class Batch:
    input_ids: torch.Tensor  # int64 [B, S], right-padded with pad_id
    attention_mask: torch.Tensor  # int64 [B, S], 1 for real tokens
    lengths: torch.Tensor  # int64 [B], tokens per request (>= 1)


def max_positions(config: dict) -> int | None:
    """max_position_embeddings of config.json, or of its text_config when the top level has none
    (Qwen3.5's model_type "qwen3_5" keeps the text model's fields there)."""
    n = config.get("max_position_embeddings")
    text = config.get("text_config")
    if not n and isinstance(text, dict):
        n = text.get("max_position_embeddings")
    return int(n) if n else None


def token_limit(package_dir: Path, config: dict) -> int:
    if config.get("vsr_max_tokens"):
        return int(config["vsr_max_tokens"])
    positions = max_positions(config)
    st = Path(package_dir) / "sentence_bert_config.json"
    if st.is_file():
        n = read_json_object(st).get("max_seq_length")
        if n:
            try:
                n = int(n)
            except (TypeError, ValueError):
                raise PackageError(f"{st}: max_seq_length {n!r} is not an integer") from None
            return min(n, positions or n)
    if positions:
        return positions
    raise PackageError(f"{package_dir}/config.json: no max_position_embeddings (or vsr_max_tokens) to bound request length")


def _text_problem(text: object) -> str | None:
    """The message for a request that is not a non-empty string (no tokenizer needed), or None."""
    if not isinstance(text, str):
        return f"request text must be a string, got {type(text).__name__}"
    if not text.strip():
        return "empty text"
    return None


class PackageTokenizer:
    def __init__(self, package_dir: str | Path, config: dict):
        package_dir = Path(package_dir)
        path = package_dir / "tokenizer.json"
        if not path.is_file():
            raise PackageError(f"{package_dir}: no tokenizer.json (the package's tokenizer is required)")
        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception on a malformed file
            raise PackageError(f"{path}: cannot be read as a tokenizers file: {e}") from e
        # The pad id: the file's own padding token, else the config's, else 0 (it only
        # fills masked positions, so any valid id gives the same answers).
        pad = tok.padding
        if pad is not None:
            self.pad_id = int(pad["pad_id"])
        elif config.get("pad_token_id") is not None:
            self.pad_id = int(config["pad_token_id"])
        else:
            self.pad_id = 0
        tok.no_padding()
        tok.no_truncation()
        self.tokenizer = tok
        self.limit = token_limit(package_dir, config)

    def encode(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(list(texts))]

    def _check_ids(self, ids: list[int]) -> str | None:
        if len(ids) == 0:
            return "text has no tokens"
        if len(ids) > self.limit:
            return f"text is too long: {len(ids)} tokens, this model takes at most {self.limit}"
        return None

    def encode_each(self, texts: list[str]) -> tuple[list[list[int] | None], list[str | None]]:
        """(ids, problems), one tokenizer pass: per text its token ids, or None and the message
        saying why for a text this model must not answer (the others are still encoded)."""
        problems: list[str | None] = [_text_problem(t) for t in texts]
        todo = [i for i, p in enumerate(problems) if p is None]
        ids: list[list[int] | None] = [None] * len(texts)
        for i, x in zip(todo, self.encode([texts[i] for i in todo]) if todo else [], strict=True):
            problems[i] = self._check_ids(x)
            if problems[i] is None:
                ids[i] = x
        return ids, problems

    def encode_checked(self, texts: list[str]) -> list[list[int]]:
        """Token ids of every text (one tokenizer pass); RequestError names the first bad request."""
        ids, problems = self.encode_each(texts)
        for i, p in enumerate(problems):
            if p is not None:
                raise RequestError(f"request {i}: {p}")
        return ids  # type: ignore[return-value]  # no problem, so no None

    def pad(self, ids: list[list[int]], length: int | None = None) -> Batch:
        """Right-pad to the longest (or to `length`, which must not be shorter), with the attention mask."""
        S = max(len(x) for x in ids)
        if length is not None:
            if length < S:
                raise ValueError(f"pad length {length} is shorter than the batch's longest request ({S} tokens)")
            S = length
        # Whole-batch tensors: a tensor per request costs about 6 us of host time each.
        input_ids = torch.tensor([x + [self.pad_id] * (S - len(x)) for x in ids], dtype=torch.int64)
        lengths = torch.tensor([len(x) for x in ids], dtype=torch.int64)
        mask = (torch.arange(S)[None, :] < lengths[:, None]).to(torch.int64)
        return Batch(input_ids, mask, lengths)

    def batch(self, texts: list[str]) -> Batch:
        """Tokenize and right-pad to the batch's longest; RequestError names the first bad request."""
        return self.pad(self.encode_checked(texts))
