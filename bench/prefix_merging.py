"""Throughput of the prefix_merging builder on long synthetic sessions.

    python bench/prefix_merging.py [--repeat 5] [--merge exact|prompt_prefix]

Each session has N turns whose prompts grow linearly from a quarter of the final length to the final length (the
default row: 200 turns, final prompt 32K tokens). Every turn samples 40 tokens ending in <|im_end|>; the next prompt
holds that turn and adds a tool result and the generation prompt. Under ``--merge exact`` (the default rule) it holds
the sampled ids verbatim (as token-in/token-out does); under ``--merge prompt_prefix`` it re-renders the turn with one
token changed (as when tool arguments are re-serialized), which that rule merges anyway: one chain either way.
Token ids are fresh int objects per prompt, as after JSON parsing, so list comparisons cannot take the identity
shortcut. Rows at half and double the size (prompt length, then number of turns) show that the cost is
linear in prompt tokens: ns per prompt token stays flat.

Reported: best-of-N wall time, prompt tokens/s (the sum of all prompt lengths divided by the time) and ns/token for
the chain partition alone, the full build (partition, merging, logprob entries), and verify.
"""

from __future__ import annotations

import argparse
import array
import os
import platform
import random
import time
from collections.abc import Callable

from polar_cli.builders import build_trajectory, verify
from polar_cli.builders.chains import partition
from polar_cli.builders.common import gc_paused
from polar_cli.builders.config import MergeRule
from polar_cli.models import Completion

IM_END = 151645
IM_START, ASSISTANT, NL = 151644, 77091, 198
SAMPLED = 40


def session(turns: int, final_prompt: int, seed: int = 0, *, rerender: bool = False) -> list[Completion]:
    rng = random.Random(seed)
    tokens = lambda n: [rng.randrange(300, 150_000) for _ in range(n)]  # noqa: E731 - ids > 256: no small-int cache
    first = final_prompt // 4
    growth = (final_prompt - first) // max(1, turns - 1)
    prompt = [*tokens(first - 3), IM_START, ASSISTANT, NL]
    comps = []
    for index in range(turns):
        sampled = [*tokens(SAMPLED - 1), IM_END]
        comps.append(
            Completion.model_construct(  # trusted synthetic data: skip validation in setup, not in what is timed
                completion_id=f"c{index}",
                session_id="bench",
                index=index,
                provider="openai_chat",
                model="m",
                request={},
                request_messages=[],
                request_tools=None,
                request_params={},
                response_message={"role": "assistant", "content": ""},
                prompt_ids=array.array("q", prompt).tolist(),  # fresh int objects, as from a JSON parser
                response_ids=sampled,
                response_logprobs=[-0.5] * SAMPLED,
                response_tokens=None,
                finish_reason="stop",
                token_source="backend",
                backend=None,
                started_at=0.0,
                finished_at=0.0,
                backend_seconds=None,
                metadata={},
            )
        )
        rendered = [*sampled[:-2], 299, IM_END] if rerender else sampled  # one token re-rendered differently
        prompt = [*prompt, *rendered, *tokens(max(1, growth - SAMPLED - 3)), IM_START, ASSISTANT, NL]
    return comps


def paused_partition(comps: list[Completion], eot: frozenset[int], merge: MergeRule) -> object:
    with gc_paused():  # as inside build_trajectory
        return partition(comps, eot, merge)


def best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--merge", choices=["exact", "prompt_prefix"], default="exact")
    args = parser.parse_args()
    merge: MergeRule = args.merge
    eot = frozenset([IM_END])
    rows = [(200, 16_384), (200, 32_768), (200, 65_536), (100, 32_768), (400, 32_768)]
    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs; best of {args.repeat}; "
          f"merge: {merge}")
    header = f"{'turns':>5} {'final':>6} {'prompt tok':>11} | {'phase':<9} {'ms':>8} {'M tok/s':>8} {'ns/tok':>7}"
    print(header)
    print("-" * len(header))
    for turns, final in rows:
        comps = session(turns, final, rerender=merge == "prompt_prefix")
        total = sum(len(c.prompt_ids) for c in comps)
        traj = build_trajectory("prefix_merging", comps, eos_token_id=IM_END, merge=merge)
        assert traj.metadata["chains"] == 1 and verify(traj, comps).ok
        phases = {
            "partition": lambda comps=comps: paused_partition(comps, eot, merge),
            "build": lambda comps=comps: build_trajectory("prefix_merging", comps, eos_token_id=IM_END, merge=merge),
            "verify": lambda comps=comps, traj=traj: verify(traj, comps),
        }
        for name, fn in phases.items():
            seconds = best(fn, args.repeat)
            print(
                f"{turns:>5} {final // 1024:>5}K {total:>11,} | {name:<9} {seconds * 1e3:>8.1f} "
                f"{total / seconds / 1e6:>8.1f} {seconds / total * 1e9:>7.2f}"
            )


if __name__ == "__main__":
    main()
