"""A tiny, random MiniCPM-o 4.5 model folder that ``vllm serve --omni`` accepts (real-server lane).

Everything is written offline. The LLM stages (Thinker, Talker) get their random weights from
``load_format: dummy``, so only their configs are written here; Code2Wav reads real files under
``assets/token2wav``, written by this project's random-checkpoint writer. What the folder holds:

* ``config.json``: ``model_type: minicpmo``, ``version: "4.5"`` (vLLM-Omni routes on it), a
  two-layer Qwen3-style Thinker (``attention_bias: false``), tiny vision and audio sub-configs
  and a one-layer Talker (``tts_config``). Every attention head is 64 wide: vLLM's CPU attention
  refuses narrower heads. The Talker keeps the released codec vocabulary (6561 codes plus EOS),
  which the Code2Wav flow and the pipeline's fixed stop id 6561 assume.
* ``configuration_minicpmo.py``: ``minicpmo`` is not a Transformers model type, so ``auto_map``
  points at this one-line module, which re-exports vLLM-Omni's own ``MiniCPMOConfig``.
* ``tokenizer.json`` and ``tokenizer_config.json``: a byte-level BPE trained here on a few
  sentences, MiniCPM-o's special tokens and a ChatML chat template. The pipeline fixes some ids
  (Stage 0's stop ids 151704 and 151645, ``<|tts_bos|>`` 151703), and vLLM refuses a stop id
  outside the model's vocabulary, so the vocabulary runs to 151705 entries: the few hundred
  trained ones, the special tokens at those ids, and unused ``<|reserved_N|>`` fillers. The
  Thinker's vocabulary is the tokenizer's, so every id it samples decodes. The chat template
  emits no ``<|tts_bos|>``; in turn mode the bridge then conditions the Talker on the whole
  generated reply.
* ``assets/token2wav`` and ``assets/HT_ref_audio.wav``: the tiny Code2Wav checkpoint of the
  vLLM-Omni lane and its default prompt voice (2 s, 24 kHz).
* ``model.safetensors``: one placeholder tensor. Code2Wav loads with vLLM's default loader,
  which refuses a folder without weight files; its ``load_weights`` reads none of them and
  builds the Token2wav backend from ``assets`` at start-up, as it does on the released folder.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

HEAD_DIM = 64  # the narrowest head vLLM's CPU attention accepts
THINKER_HIDDEN = 128
TALKER_HIDDEN = 128
NUM_AUDIO_TOKENS = 6562  # codes 0..6560 and codec EOS 6561, as released

# Special tokens at the ids vLLM-Omni's minicpmo_4_5 pipeline fixes: Stage 0 stops on 151704 and
# 151645 (vLLM refuses a stop id outside the model's vocabulary), and the Thinker-to-Talker
# bridge looks for <|tts_bos|> at 151703. The Qwen ids of the other ChatML tokens come along.
FIXED_IDS = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<|tts_bos|>": 151703,
    "<|tts_eos|>": 151704,
}
VOCAB_SIZE = max(FIXED_IDS.values()) + 1
# The rest of MiniCPM-o's special tokens, right after the trained BPE tokens.
OTHER_SPECIAL_TOKENS = (
    "<unk>", "<|spk_bos|>", "<|spk|>", "<|spk_eos|>",
    "<|listen|>", "<|speak|>", "<|turn_eos|>", "<|chunk_eos|>", "<|chunk_tts_eos|>",
    "<image>", "</image>", "<slice>", "</slice>", "<image_id>", "</image_id>",
    "<unit>", "</unit>", "<audio>", "</audio>",
)

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

CORPUS = (
    "Hello, how are you today? I am fine, thank you.",
    "The quick brown fox jumps over the lazy dog.",
    "Please read this sentence aloud in a calm voice.",
    "Speech synthesis turns written text into spoken words.",
    "One, two, three, four, five, six, seven, eight, nine, ten.",
)

CONFIG_MODULE = (
    "from vllm_omni.model_executor.models.minicpmo_4_5.minicpmo_4_5_omni_llm import "
    "MiniCPMOConfig  # noqa: F401\n"
)


def write_tiny_minicpmo(folder: Path) -> Path:
    """Write the whole model folder into ``folder`` (created if absent); returns ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    ids = write_tokenizer(folder)
    (folder / "config.json").write_text(json.dumps(model_config(ids), indent=2))
    (folder / "configuration_minicpmo.py").write_text(CONFIG_MODULE)
    write_placeholder_weights(folder / "model.safetensors")
    write_code2wav_assets(folder / "assets")
    return folder


def write_tokenizer(folder: Path) -> dict[str, int]:
    """A byte-level BPE trained on :data:`CORPUS`, its vocabulary filled with unused
    ``<|reserved_N|>`` entries up to :data:`VOCAB_SIZE` so the special tokens sit at their
    fixed ids; returns the special tokens' ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=320, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    trained.train_from_iterator(CORPUS, trainer=trainer)
    learned = json.loads(trained.to_str())["model"]
    vocab: dict[str, int] = dict(learned["vocab"])
    for token in OTHER_SPECIAL_TOKENS:
        vocab[token] = len(vocab)
    by_id = {i: token for token, i in FIXED_IDS.items()}
    for i in range(len(vocab), VOCAB_SIZE):
        vocab[by_id.get(i, f"<|reserved_{i}|>")] = i

    merges = [tuple(pair) for pair in learned["merges"]]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    specials = [*OTHER_SPECIAL_TOKENS, *FIXED_IDS]
    tokenizer.add_special_tokens(specials)  # already in the vocabulary: they keep their ids
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "<unk>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "bos_token": None,
        "add_bos_token": False,
        "model_max_length": 2048,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }, indent=2))
    ids = {token: tokenizer.token_to_id(token) for token in specials}
    if tokenizer.get_vocab_size() != VOCAB_SIZE or any(
            ids[token] != i for token, i in FIXED_IDS.items()):
        raise AssertionError("the tokenizer's special tokens are not at their fixed ids")
    return ids


def model_config(ids: dict[str, int]) -> dict[str, Any]:
    vocab = VOCAB_SIZE
    return {
        "architectures": ["MiniCPMO"],
        "model_type": "minicpmo",
        "version": "4.5",
        "auto_map": {"AutoConfig": "configuration_minicpmo.MiniCPMOConfig"},
        "torch_dtype": "bfloat16",  # as released; the deploy config sets the serving dtype
        # Thinker: Qwen3 (vLLM-Omni picks Qwen3 when attention_bias is false)
        "attention_bias": False,
        "vocab_size": vocab,
        "hidden_size": THINKER_HIDDEN,
        "intermediate_size": 2 * THINKER_HIDDEN,
        "num_hidden_layers": 2,
        "num_attention_heads": THINKER_HIDDEN // HEAD_DIM,
        "num_key_value_heads": THINKER_HIDDEN // HEAD_DIM,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "bos_token_id": ids["<|im_start|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
        # multimodal front ends, built tiny (no image or audio input is served)
        "query_num": 4,
        "image_size": 56,
        "patch_size": 14,
        "slice_config": {"max_slice_nums": 1, "patch_size": 14, "scale_resolution": 56},
        "vision_config": {
            "model_type": "siglip_vision_model", "hidden_size": HEAD_DIM,
            "intermediate_size": 2 * HEAD_DIM, "num_attention_heads": 1,
            "num_hidden_layers": 1, "patch_size": 14, "image_size": 56,
        },
        "audio_config": {
            "model_type": "whisper", "d_model": HEAD_DIM, "encoder_layers": 1,
            "encoder_attention_heads": 1, "encoder_ffn_dim": 4 * HEAD_DIM, "decoder_layers": 1,
            "decoder_attention_heads": 1, "decoder_ffn_dim": 4 * HEAD_DIM, "num_mel_bins": 80,
            "max_source_positions": 1500,
        },
        "audio_pool_step": 5,
        "tts_config": {
            "model_type": "conditional_chattts",
            "llm_dim": THINKER_HIDDEN,
            "hidden_size": TALKER_HIDDEN,
            "intermediate_size": 2 * TALKER_HIDDEN,
            "num_attention_heads": TALKER_HIDDEN // HEAD_DIM,
            "num_key_value_heads": TALKER_HIDDEN // HEAD_DIM,
            "head_dim": HEAD_DIM,
            "num_hidden_layers": 1,
            "max_position_embeddings": 1024,
            "num_audio_tokens": NUM_AUDIO_TOKENS,
            "num_text_tokens": vocab,
            "num_vq": 1,
            # the Talker's own defaults for these two (ids of its text embedding)
            "audio_bos_token_id": 151687,
            "text_eos_token_id": 151692,
            "normalize_projected_hidden": True,
        },
    }


def write_placeholder_weights(path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    save_file({"placeholder": torch.zeros(1)}, str(path))


def write_code2wav_assets(assets: Path) -> None:
    """The vLLM-Omni lane's tiny Code2Wav checkpoint and the default prompt voice."""
    from minicpm_speech_runtime.fixtures.checkpoint import TINY, write_random_checkpoint
    from minicpm_speech_runtime.fixtures.synth import wav_bytes

    # vLLM-Omni loads the speech tokenizer with s3tokenizer.load_model, which builds the
    # released width and depth whatever the file holds.
    dims = dataclasses.replace(TINY, tokenizer_width=1280, tokenizer_layers=6)
    write_random_checkpoint(assets / "token2wav", dims, seed=0)
    (assets / "HT_ref_audio.wav").write_bytes(wav_bytes(2.0, 24000, seed=7))
