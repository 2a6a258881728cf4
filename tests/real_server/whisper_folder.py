"""A tiny random Whisper in Hugging Face's layout, for the official WER evaluator in the lane.

The quality run's evaluator (vLLM-Omni's ``seed_tts_eval``) loads ``openai/whisper-large-v3``
with ``WhisperProcessor`` and ``WhisperForConditionalGeneration`` from the path in
``SEED_TTS_HF_WHISPER_MODEL``; nothing can be downloaded here, so the lane writes a folder of
the same layout: a byte-level Whisper tokenizer (the 256 byte symbols, no merges, Whisper's
special tokens with every language tag), the standard 80-bin feature extractor, and a
one-layer model with random weights whose generation config knows English and transcription.
Its transcripts are noise, as the speech it hears is: the lane checks that the evaluator ran
and that every number it wrote is parsed, not what the numbers say.
"""

from __future__ import annotations

import json
from pathlib import Path

MAX_TOKENS = 24  # a transcript's length: noise in, noise out, so keep it short


def byte_symbols() -> list[str]:
    """The 256 printable stand-ins for bytes of byte-level BPE (GPT-2's table, as Whisper's)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]  # fmt: skip
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def write_tiny_whisper(folder: Path, seed: int = 0) -> Path:
    import torch
    from transformers import (
        GenerationConfig,
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperProcessor,
        WhisperTokenizer,
    )
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    folder.mkdir(parents=True, exist_ok=True)
    languages = [f"<|{code}|>" for code in LANGUAGES]
    specials = ["<|endoftext|>", "<|startoftranscript|>", *languages, "<|translate|>",
                "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nocaptions|>",
                "<|notimestamps|>"]  # fmt: skip
    vocab = {symbol: i for i, symbol in enumerate(byte_symbols())}
    for token in specials:
        vocab[token] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    eos = "<|endoftext|>"
    tokenizer = WhisperTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"),
                                 unk_token=eos, bos_token=eos, eos_token=eos, pad_token=eos)
    tokenizer.add_special_tokens({"additional_special_tokens": specials[1:]})
    WhisperProcessor(feature_extractor=WhisperFeatureExtractor(feature_size=80),
                     tokenizer=tokenizer).save_pretrained(folder)  # fmt: skip

    start, end = vocab["<|startoftranscript|>"], vocab[eos]
    config = WhisperConfig(
        vocab_size=len(vocab), num_mel_bins=80, d_model=64, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=128,
        decoder_ffn_dim=128, max_source_positions=1500, max_target_positions=64,
        decoder_start_token_id=start, eos_token_id=end, pad_token_id=end, bos_token_id=end,
        begin_suppress_tokens=None, suppress_tokens=None,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(config)
    model.generation_config = GenerationConfig(
        decoder_start_token_id=start, eos_token_id=end, pad_token_id=end, bos_token_id=end,
        max_length=MAX_TOKENS, is_multilingual=True,
        lang_to_id={tag: vocab[tag] for tag in languages},
        task_to_id={"transcribe": vocab["<|transcribe|>"], "translate": vocab["<|translate|>"]},
        no_timestamps_token_id=vocab["<|notimestamps|>"], forced_decoder_ids=None,
    )  # fmt: skip
    model.save_pretrained(folder)
    return folder
