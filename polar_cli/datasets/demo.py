"""``demo``: small self-contained coding tasks for the real pi CLI, each carrying its scripted-backend script.

Every task runs in the ``local`` runtime (its files are written by prepare actions), is scored by ``test_on_output``
and carries in ``metadata.script`` the assistant turns the scripted backend replays, in pi's own tool shapes (``read``,
``write``, ``edit``, ``bash``). So ``polar generate --harness pi --dataset demo --backend scripted`` needs no network,
no model and no GPU.

Each task's script has two variants, cycled over its samples: one solves the task, one gets it wrong (reward 0), so
``--samples 2`` (or more) gives every task mixed rewards, and ``polar export`` a preference pair per task. Sample 0
plays the right answer, but for ``count-lines``, whose first variant is the wrong one: one sample per task still has
a rejected row for acceptance tables.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from pydantic import Field

from polar_cli.errors import ConfigError
from polar_cli.interfaces import Dataset
from polar_cli.models import StrictModel, TaskRequest
from polar_cli.models.task import SCRIPT_KEY


def _call(n: int, name: str, **arguments: Any) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
        ],
    }


def _say(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def _write(path: str, content: str) -> dict[str, Any]:
    return {"type": "write_file", "path": path, "content": content}


CALC = "def add(a, b):\n    return a - b\n"
CALC_TEST = "from calc import add\n\nassert add(2, 3) == 5, add(2, 3)\nassert add(-1, 1) == 0\nprint('ok')\n"
STRINGS = "def shout(text):\n    return text.lower() + '!'\n"
STRINGS_TEST = "from strings import shout\n\nassert shout('hi') == 'HI!', shout('hi')\nprint('ok')\n"
FIZZ = (
    "def fizzbuzz(n):\n"
    "    if n % 15 == 0:\n        return 'FizzBuzz'\n"
    "    if n % 3 == 0:\n        return 'Fizz'\n"
    "    if n % 5 == 0:\n        return 'Buzz'\n"
    "    return str(n)\n"
)
FIZZ_TEST = (
    "from fizzbuzz import fizzbuzz\n\n"
    "assert [fizzbuzz(i) for i in (1, 3, 5, 15)] == ['1', 'Fizz', 'Buzz', 'FizzBuzz']\nprint('ok')\n"
)

FIZZ_WRONG = (  # 15 is caught by the 3 case first: fizzbuzz(15) == 'Fizz'
    "def fizzbuzz(n):\n"
    "    if n % 3 == 0:\n        return 'Fizz'\n"
    "    if n % 5 == 0:\n        return 'Buzz'\n"
    "    if n % 15 == 0:\n        return 'FizzBuzz'\n"
    "    return str(n)\n"
)

Script = list[dict[str, Any]]

# name -> (repo, instruction, prepare actions, test command, script variants: sample k plays variant k mod 2)
TASKS: dict[str, tuple[str, str, list[dict[str, Any]], str, list[Script]]] = {
    "hello-file": (
        "demo/files",
        "Create a file greeting.txt in the current directory containing exactly the line: hello, polar",
        [],
        'test "$(cat greeting.txt)" = "hello, polar"',
        [
            [_call(1, "write", path="greeting.txt", content="hello, polar\n"), _say("greeting.txt is written.")],
            [_call(1, "write", path="greeting.txt", content="hello polar\n"), _say("greeting.txt is written.")],
        ],
    ),
    "fix-add": (
        "demo/calc",
        "The function add in calc.py is wrong and test_calc.py fails. Fix add so that `python3 test_calc.py` passes.",
        [_write("calc.py", CALC), _write("test_calc.py", CALC_TEST)],
        "python3 test_calc.py",
        [
            [
                _call(1, "read", path="calc.py"),
                _call(2, "edit", path="calc.py", edits=[{"oldText": "return a - b", "newText": "return a + b"}]),
                _call(3, "bash", command="python3 test_calc.py"),
                _say("add now returns a + b and test_calc.py passes."),
            ],
            [
                _call(1, "read", path="calc.py"),
                _call(2, "edit", path="calc.py", edits=[{"oldText": "return a - b", "newText": "return a * b"}]),
                _say("add is fixed."),
            ],
        ],
    ),
    "fizzbuzz": (
        "demo/calc",
        "Write fizzbuzz.py with a function fizzbuzz(n) returning 'Fizz', 'Buzz', 'FizzBuzz' or str(n); "
        "test_fizzbuzz.py must pass.",
        [_write("test_fizzbuzz.py", FIZZ_TEST)],
        "python3 test_fizzbuzz.py",
        [
            [
                _call(1, "write", path="fizzbuzz.py", content=FIZZ),
                _call(2, "bash", command="python3 test_fizzbuzz.py"),
                _say("fizzbuzz.py is written and its test passes."),
            ],
            [_call(1, "write", path="fizzbuzz.py", content=FIZZ_WRONG), _say("fizzbuzz.py is written.")],
        ],
    ),
    "fix-shout": (
        "demo/strings",
        "shout in strings.py should upper-case its text and add '!'. Fix it so `python3 test_strings.py` passes.",
        [_write("strings.py", STRINGS), _write("test_strings.py", STRINGS_TEST)],
        "python3 test_strings.py",
        [
            [
                _call(1, "bash", command="sed -i 's/text.lower()/text.upper()/' strings.py && python3 test_strings.py"),
                _say("shout now upper-cases; the test passes."),
            ],
            [
                _call(1, "bash", command="sed -i 's/text.lower()/text.title()/' strings.py"),
                _say("shout is fixed."),
            ],
        ],
    ),
    "count-lines": (
        "demo/files",
        "Write the number of lines in data.txt (just the number) to count.txt.",
        [_write("data.txt", "alpha\nbeta\ngamma\n")],
        'test "$(cat count.txt)" = 3',
        [
            [  # a wrong answer first, on purpose: with one sample per task, this task is never accepted
                _call(1, "bash", command="echo 4 > count.txt && cat count.txt"),
                _say("count.txt holds the count."),
            ],
            [_call(1, "bash", command="wc -l < data.txt > count.txt && cat count.txt"), _say("count.txt holds 3.")],
        ],
    ),
}


class DemoOptions(StrictModel):
    """Options of the ``demo`` dataset."""

    tasks: list[str] | None = Field(default=None, description="task names to keep (default: all, in order)")
    timeout_seconds: float = Field(default=300.0, gt=0, description="each task's timeout_seconds")


def demo_task(name: str, timeout_seconds: float = 300.0) -> TaskRequest:
    repo, instruction, prepare, test, variants = TASKS[name]
    script = {"variants": variants, "choose": "cycle"}
    return TaskRequest.model_validate(
        {
            "task_id": f"demo-{name}",
            "instruction": instruction,
            "timeout_seconds": timeout_seconds,
            "runtime": {"backend": "local", "prepare": prepare},
            "agent": {"harness": "pi"},
            "builder": {"strategy": "prefix_merging"},
            "evaluator": {"strategy": "test_on_output", "config": {"command": test}},
            "metadata": {"repo": repo, "instance_id": name, SCRIPT_KEY: script},
        }
    )


class DemoDataset(Dataset):
    name = "demo"
    description = "a few offline coding tasks for pi, each with its scripted-backend script (no network, no GPU)"
    options = DemoOptions

    def tasks(self, **config: Any) -> Iterator[TaskRequest]:
        options: DemoOptions = self.parse_config(config)
        names = options.tasks if options.tasks is not None else list(TASKS)
        unknown = [n for n in names if n not in TASKS]
        if unknown:
            raise ConfigError(f"dataset 'demo': unknown task(s) {unknown}; known: {', '.join(TASKS)}")
        for name in names:
            yield demo_task(name, options.timeout_seconds)
