"""A Qwen-vocabulary tokenizer built offline from dashscope's ``qwen.tiktoken``.

The 151,643 byte-level BPE ranks are Qwen's regular vocabulary (shared by Qwen1 through Qwen3); the added tokens are
appended in Qwen3's order so that their ids match the released models (``<|im_end|>`` = 151645, ``<think>`` =
151667, ...). The chat template is the demo ChatML one (tools, tool calls, reasoning blocks). Conversion takes a few
seconds, so tests build it once per session.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

# Qwen2's pre-tokenizer split: single digits, letters with at most one leading non-letter.
PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# (token, special) from id 151643 on, as in Qwen3's tokenizer.json.
ADDED = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True), ("<|quad_start|>", True),
    ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False),
]
FIRST_ADDED_ID = 151643
IM_END_ID = 151645
ENDOFTEXT_ID = 151643


def qwen_tiktoken_path() -> Path | None:
    """dashscope's copy of the Qwen BPE ranks, found without importing dashscope (a large SDK)."""
    spec = importlib.util.find_spec("dashscope")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "resources" / "qwen.tiktoken"
    return path if path.is_file() else None


def build_qwen_tokenizer(out_dir: Path) -> Path:
    """Convert ``qwen.tiktoken`` to a HF fast tokenizer with Qwen's added tokens and a ChatML template."""
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    from polar_cli.demo_model import CHAT_TEMPLATE

    ranks = qwen_tiktoken_path()
    if ranks is None:
        raise FileNotFoundError("dashscope/resources/qwen.tiktoken (pip install dashscope)")
    tok = TikTokenConverter(vocab_file=str(ranks), pattern=PATTERN).converted()
    tok.normalizer = normalizers.NFC()
    for content, special in ADDED:
        token = AddedToken(content, special=special, normalized=False)
        (tok.add_special_tokens if special else tok.add_tokens)([token])
    for offset, (content, _) in enumerate(ADDED):
        if tok.token_to_id(content) != FIRST_ADDED_ID + offset:
            raise AssertionError(f"{content} got id {tok.token_to_id(content)}")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", clean_up_tokenization_spaces=False
    )
    fast.chat_template = CHAT_TEMPLATE
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir), save_jinja_files=False)
    # Qwen's generation config stops on both ids.
    gen = {"eos_token_id": [IM_END_ID, ENDOFTEXT_ID], "pad_token_id": ENDOFTEXT_ID}
    (out_dir / "generation_config.json").write_text(json.dumps(gen) + "\n", encoding="utf-8")
    return out_dir
