"""A tokenizer with Qwen2.5-VL's shape, built offline: its vocabulary size, special tokens and ids,
pre-tokenizer and chat use, from generated merges (no download, no training corpus).

What a random full-size base folder needs from a tokenizer is its shape, not its merges: the
text encoder's embedding rows, the ids of the special tokens the pipeline and the config name
(``<|endoftext|>`` pads, ``<|im_end|>`` ends, ``<|image_pad|>`` ...), and a byte-level BPE that
turns any instruction into ids below 151643. The merges are every pair of byte symbols (common
text symbols first), then triples, until the base vocabulary has Qwen's 151643 tokens.
"""

from __future__ import annotations

from typing import Any

from dit4dit_npu.models.tiny import qwen_fast_tokenizer
from dit4dit_npu.weights.real_size import QWEN_BASE_TOKENS, QWEN_SPECIAL_TOKENS, QWEN_SPLIT


def _symbol_order() -> list[str]:
    """The 256 byte-level symbols, the ones instructions use most first (space marker, letters,
    digits, punctuation), so the early merges are the ones text hits."""
    from tokenizers import pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    first = "\u0120" + "etaoinsrhldcumfpgwybvkxjqz" + "ETAOINSRHLDCUMFPGWYBVKXJQZ" + "0123456789" + ".,-_'!?:;()"
    return list(dict.fromkeys([c for c in first if c in alphabet] + alphabet))


def qwen_merges(base_tokens: int = QWEN_BASE_TOKENS) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """(vocab, merges) of a byte-level BPE with exactly ``base_tokens`` tokens: the 256 symbols, all
    symbol pairs, then (pair, symbol) triples in order."""
    symbols = _symbol_order()
    vocab = {s: i for i, s in enumerate(symbols)}
    merges: list[tuple[str, str]] = []
    pairs = [(a, b) for a in symbols for b in symbols]
    for a, b in pairs:
        if len(vocab) >= base_tokens:
            break
        vocab[a + b] = len(vocab)
        merges.append((a, b))
    for a, b in pairs:  # triples: a pair merged with one more symbol
        for c in symbols:
            if len(vocab) >= base_tokens:
                return vocab, merges
            if a + b + c not in vocab:
                vocab[a + b + c] = len(vocab)
                merges.append((a + b, c))
    return vocab, merges


def build_qwen_tokenizer(model_max_length: int = 131072) -> Any:
    """A ``PreTrainedTokenizerFast`` of Qwen2.5-VL's shape: 151643 base tokens, then its 22 special
    tokens (ids 151643 ... 151664), ``<|endoftext|>`` as pad, ``<|im_end|>`` as end, the text part
    of its chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    vocab, merges = qwen_merges()
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(QWEN_SPECIAL_TOKENS))
    return qwen_fast_tokenizer(tok, model_max_length)
