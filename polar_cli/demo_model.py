"""A tiny, deterministic, offline demo tokenizer and random-weight causal LM.

Used to run a real inference server (vLLM on the CPU) in tests without downloading weights. Top-level imports are
stdlib only so that the file can be run by path from another virtual environment (``-P`` keeps the folder
out of ``sys.path``: a package there, such as polar_cli/datasets, would shadow an installed one)::

    python -P polar_cli/demo_model.py tokenizer OUT_DIR   # needs `tokenizers` + `transformers`
    python -P polar_cli/demo_model.py model OUT_DIR       # also needs `torch`
    python -P polar_cli/demo_model.py model OUT_DIR --seed 7   # the same model with other random weights

Other seeds give the same tokenizer and architecture with different weights: what a trainer's checkpoint looks like
to an inference server that reloads weights in place.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]
# Added but not "special": they must survive `skip_special_tokens=True` so tool/reasoning parsers can see them.
ADDED_TOKENS = ["<tool_call>", "</tool_call>", "<think>", "</think>"]

VOCAB_SIZE = 3072
SEED = 1234

# ChatML with Qwen2.5/hermes-style tools and Qwen3-style reasoning blocks.
CHAT_TEMPLATE = r"""{%- macro render_content(content) -%}
{%- if content is none -%}
{%- elif content is string -%}{{- content -}}
{%- else -%}{{- content | selectattr('type', 'equalto', 'text') | map(attribute='text') | join('\n') -}}
{%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(system='', start=0) -%}
{%- if messages and messages[0]['role'] == 'system' -%}
{%- set ns.system = render_content(messages[0]['content']) -%}
{%- set ns.start = 1 -%}
{%- endif -%}
{%- if tools -%}
{{- '<|im_start|>system\n' -}}
{%- if ns.system -%}{{- ns.system + '\n\n' -}}{%- endif -%}
{{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' -}}
{{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
{%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
{{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within ' -}}
{{- '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}' -}}
{{- '\n</tool_call><|im_end|>\n' -}}
{%- elif ns.start == 1 -%}
{{- '<|im_start|>system\n' + ns.system + '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages[ns.start:] -%}
{%- set role = message['role'] -%}
{%- if role == 'tool' -%}
{%- if loop.first or loop.previtem['role'] != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
{{- '\n<tool_response>\n' + render_content(message['content']) + '\n</tool_response>' -}}
{%- if loop.last or loop.nextitem['role'] != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
{%- elif role == 'assistant' -%}
{{- '<|im_start|>assistant\n' -}}
{%- set reasoning = message.get('reasoning_content') or message.get('reasoning') -%}
{%- if reasoning -%}{{- '<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' -}}{%- endif -%}
{%- set content = render_content(message.get('content')) -%}
{{- content -}}
{%- for call in message.get('tool_calls') or [] -%}
{%- set fn = call['function'] if call['function'] is defined else call -%}
{%- if loop.first and content or not loop.first -%}{{- '\n' -}}{%- endif -%}
{{- '<tool_call>\n{"name": ' + (fn['name'] | tojson) + ', "arguments": ' -}}
{%- if fn['arguments'] is mapping -%}{{- fn['arguments'] | tojson -}}{%- else -%}{{- fn['arguments'] -}}{%- endif -%}
{{- '}\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\n' -}}
{%- else -%}
{{- '<|im_start|>' + role + '\n' + render_content(message['content']) + '<|im_end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""

_CORPUS = r"""
The quick brown fox jumps over the lazy dog. A user asks the assistant to fix a failing test in the repository.
The assistant reads the file, runs the tests, and then edits the function so that every test passes again.
You are a helpful assistant. Please answer the question below as clearly and briefly as you can.
What is the weather like today in Paris? It is sunny with a light breeze and a temperature of 21 degrees.
Agents call tools, observe results, and decide what to do next until the task is complete or the budget runs out.
Reinforcement learning from agent traces needs the exact token ids that the model saw and the ones it sampled.
Hello, world! Thanks for your help. Sure, here is the answer: the value is 42. Let me think about that first.
I will search the code base for the definition, then open the file and read the relevant lines carefully.
The server returned an error: connection refused. Retry in 5 seconds with exponential backoff and jitter.

$ ls -la /tmp && cd /work/main && git status --short
$ python -m pytest tests -x -q --maxfail=1 -k "test_parse and not slow"
$ grep -rn "def main" src/ | head -20 | sort | uniq -c
$ pip install --upgrade pip setuptools wheel && pip install -e ".[dev]"
$ curl -s -X POST http://127.0.0.1:8000/v1/chat/completions -H "Content-Type: application/json" -d @body.json
$ echo "$HOME" > ~/.config/env.txt; export PATH="$HOME/.local/bin:$PATH"; mkdir -p build && make -j2
$ find . -name "*.py" -type f -exec wc -l {} + | tail -n 1
$ docker run --rm -it -v "$PWD:/src" -w /src python:3.11-slim bash -lc 'python --version'
$ sed -n '10,40p' README.md; cat /etc/os-release; uname -a; whoami; date -u +%Y-%m-%dT%H:%M:%SZ

{"name": "read_file", "arguments": {"path": "src/app/main.py", "start_line": 1, "end_line": 80}}
{"name": "run_command", "arguments": {"command": "pytest -q", "timeout": 120, "cwd": "/work"}}
{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
{"type": "function", "function": {"name": "search", "description": "Search the web for a query.",
 "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
 "required": ["query"]}}}
{"id": "chatcmpl-123", "object": "chat.completion", "created": 1700000000, "model": "demo",
 "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi!"}, "finish_reason": "stop"}],
 "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}}
[true, false, null, 0, 1, 2, 3.14, -7, 1e-5, "a", "b", {"k": [1, 2, {"nested": "value"}]}]

import json
import os
from pathlib import Path
from typing import Any


def load_config(path: str | Path) -> dict[str, Any]:
    '''Load a JSON config file, returning an empty dict if it does not exist.'''
    p = Path(path)
    if not p.exists():
        return {}
    with p.open("r", encoding="utf-8") as fh:
        return json.load(fh)


class Counter:
    def __init__(self, start: int = 0) -> None:
        self.value = start

    def increment(self, step: int = 1) -> int:
        self.value += step
        return self.value


async def fetch(session, url: str, *, retries: int = 3) -> bytes:
    for attempt in range(retries):
        try:
            async with session.get(url) as resp:
                resp.raise_for_status()
                return await resp.read()
        except Exception as exc:  # noqa: BLE001
            print(f"attempt {attempt} failed: {exc!r}")
    raise RuntimeError("all retries failed")


if __name__ == "__main__":
    for i, line in enumerate(open(os.environ.get("INPUT", "data.txt"))):
        if i % 2 == 0 and line.strip():
            print(i, line.rstrip("\n"))

def add(a, b):
    return a + b

const express = require("express");
const app = express();
app.get("/health", (req, res) => res.json({ status: "ok" }));
app.listen(3000, () => console.log("listening on port 3000"));
function sum(xs) { return xs.reduce((acc, x) => acc + x, 0); }
let items = [1, 2, 3].map((x) => x * 2).filter((x) => x > 2);

fn main() { let v: Vec<u32> = (0..10).collect(); println!("{:?}", v); }
SELECT id, name, created_at FROM users WHERE active = TRUE ORDER BY created_at DESC LIMIT 10;
<html><head><title>Demo</title></head><body><div class="main"><p>Hello</p></div></body></html>
# Heading
- item one
- item two
* bullet with `inline code` and **bold** text, _italics_, and a [link](https://example.com/docs?page=2).
diff --git a/src/main.py b/src/main.py
@@ -1,4 +1,5 @@
-    return a - b
+    return a + b
Traceback (most recent call last):
  File "main.py", line 12, in <module>
    main()
ValueError: invalid literal for int() with base 10: 'abc'
AssertionError: assert 3 == 4
 where 3 = add(1, 2)
FAILED tests/test_math.py::test_add - AssertionError
===== 1 failed, 12 passed, 2 skipped in 0.34s =====
0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 32 64 100 128 256 512 1000 1024 2048 4096 8192 65536
Monday Tuesday Wednesday Thursday Friday Saturday Sunday January February March April May June July
"""

_STEMS = (  # word lists as space-separated strings, split in _corpus()
    "user file path name value token model request response message tool call config server client session result "
    "error test data item list text line input output agent trace prompt content role step batch cache index query"
)
_VERBS = "get set load save parse read write run build check update create delete"
_WORDS = (
    "about after again always answer because before between change could different every example first found great "
    "however important information number people problem question really should something through together under "
    "without world would write years function variable argument parameter default return string integer boolean "
    "dictionary directory repository environment dependency version install command terminal process thread memory "
    "network timeout connection database"
)


def _corpus() -> list[str]:
    """Return the deterministic training corpus (inline text plus generated identifiers and sentences)."""
    lines = _CORPUS.strip("\n").splitlines()
    stems, verbs, words = _STEMS.split(), _VERBS.split(), _WORDS.split()
    for verb in verbs:
        for stem in stems:
            lines.append(f"def {verb}_{stem}(self, {stem}_id: int) -> {stem.capitalize()}: return self.{stem}s")
            lines.append(f"{verb}{stem.capitalize()}({stem}Id); const {stem}Count = {len(stem) * 7};")
    for i, word in enumerate(words):
        other = words[(i * 7 + 3) % len(words)]
        lines.append(f"The {word} and the {other} are {i} of {len(words)}: {word.upper()} {other.title()}.")
    for n in range(0, 300, 7):
        lines.append(f'{{"id": {n}, "score": {n / 8:.3f}, "tag": "t{n % 13}", "ok": {str(n % 2 == 0).lower()}}}')
    return lines


def build_demo_tokenizer(out_dir: str | Path) -> Path:
    """Train the demo byte-level BPE tokenizer and save it as a HF fast tokenizer in ``out_dir``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=1,
        show_progress=False,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)

    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    # Keep the chat template inside tokenizer_config.json (one file), and name the class so that transformers 4.x
    # (PreTrainedTokenizerFast) and 5.x (where that name aliases TokenizersBackend) both load it.
    fast.save_pretrained(str(out), save_jinja_files=False)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config.pop("backend", None)
    config.pop("extra_special_tokens", None)
    config.update(tokenizer_class="PreTrainedTokenizerFast", additional_special_tokens=[IM_START])
    _write_json(config_path, config)

    _write_generation_config(out, eos_id=_token_id(tok, IM_END), pad_id=_token_id(tok, ENDOFTEXT))
    return out


def build_demo_model(out_dir: str | Path, seed: int = SEED) -> Path:
    """Build the demo tokenizer plus a tiny random-weight Qwen2 causal LM into ``out_dir``; ``seed`` draws the
    weights (the default gives the byte-identical demo model)."""
    out = build_demo_tokenizer(out_dir)

    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(out))
    eos_id = _token_id(tokenizer.backend_tokenizer, IM_END)
    pad_id = _token_id(tokenizer.backend_tokenizer, ENDOFTEXT)
    # Exactly the tokenizer's size, not padded: random weights would otherwise sample ids that decode to nothing.
    vocab = len(tokenizer)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,  # head_dim 64: the smallest that vLLM's CPU attention accepts
        num_key_value_heads=2,
        # more positions than any test's context (vLLM serves it with --max-model-len 20480): a position past the
        # model's own makes vLLM compute NaNs, which then poison every later call of that server
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        bos_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).float().eval()
    model.save_pretrained(str(out), safe_serialization=True)
    # save_pretrained rewrites generation_config.json (with its own defaults); keep ours minimal and explicit.
    _write_generation_config(out, eos_id=eos_id, pad_id=pad_id)
    return out


def _token_id(tokenizer: Any, token: str) -> int:
    """Return the id of ``token`` in a ``tokenizers.Tokenizer``, failing loudly if it is missing."""
    token_id = tokenizer.token_to_id(token)
    if not isinstance(token_id, int):
        raise ValueError(f"token {token!r} is not in the vocabulary")
    return token_id


def _write_generation_config(out: Path, *, eos_id: int, pad_id: int) -> None:
    """Write ``generation_config.json``: generation stops at ``<|im_end|>``; there is no BOS (bos = pad id)."""
    config = {"bos_token_id": pad_id, "eos_token_id": eos_id, "pad_token_id": pad_id}
    _write_json(out / "generation_config.json", config)


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


_USAGE = "usage: demo_model.py tokenizer OUT_DIR | demo_model.py model OUT_DIR [--seed N]"


def main(argv: list[str] | None = None) -> int:
    """CLI: ``demo_model.py tokenizer OUT_DIR`` or ``demo_model.py model OUT_DIR [--seed N]``."""
    args = sys.argv[1:] if argv is None else argv
    seed = SEED
    if len(args) == 4 and args[0] == "model" and args[2] == "--seed" and args[3].lstrip("-").isdigit():
        seed, args = int(args[3]), args[:2]
    if len(args) != 2 or args[0] not in ("tokenizer", "model"):
        print(_USAGE, file=sys.stderr)
        return 2
    print(build_demo_tokenizer(args[1]) if args[0] == "tokenizer" else build_demo_model(args[1], seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
