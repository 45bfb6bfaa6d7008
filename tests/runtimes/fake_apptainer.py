"""A stand-in for the ``apptainer`` binary, which cannot be installed here (used by test_apptainer.py).

It records every invocation (argv and the APPTAINERENV_* variables) as a JSON line in ``$LOG`` (the path is written
into the copy the test makes) and emulates just enough: ``--version``, ``instance start/list/stop`` (state in a JSON
file) and ``exec instance://NAME``, which runs the command on the host with the instance's binds translated back to
host paths (arguments, --pwd), so the runtime's real wrapper, timeouts and kills can be exercised.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from pathlib import Path

LOG = Path("@LOG@")
STATE = LOG.parent / "instances"
PREFIX = "APPTAINERENV_"


def record(argv: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if k.startswith(PREFIX)}
    with LOG.open("a") as handle:
        handle.write(json.dumps({"argv": argv, "env": env}) + "\n")


def translate(value: str, binds: list[tuple[str, str]]) -> str:
    for host, target in binds:
        if value == target or value.startswith(target + "/"):
            return host + value[len(target) :]
    return value


def main(argv: list[str]) -> int:
    record([sys.argv[0], *argv])
    if argv == ["--version"]:
        print("apptainer version 1.3.0-fake")
        return 0
    STATE.mkdir(exist_ok=True)
    if argv[:2] == ["instance", "start"]:
        image, name = argv[-2], argv[-1]
        if image.endswith("broken.sif"):
            print("FATAL: could not open image", file=sys.stderr)
            return 255
        binds, home = [], None
        options = argv[2:-2]
        for flag, value in itertools.pairwise(options):
            if flag in ("--bind", "--home"):
                host, target = value.split(":")[:2]
                binds.append((host, target))
                home = host if flag == "--home" else home
        (STATE / f"{name}.json").write_text(json.dumps({"image": image, "binds": binds, "home": home}))
        return 0
    if argv[:2] == ["instance", "list"]:
        name = argv[-1]
        state = STATE / f"{name}.json"
        if not state.exists():
            return 1
        image = json.loads(state.read_text())["image"]
        print(json.dumps({"instances": [{"instance": name, "pid": 4242, "img": image}]}))
        return 0
    if argv[:2] == ["instance", "stop"]:
        (STATE / f"{argv[-1]}.json").unlink(missing_ok=True)
        return 0
    if argv[0] == "exec":
        uri = next(a for a in argv if a.startswith("instance://"))
        state = STATE / f"{uri.removeprefix('instance://')}.json"
        if not state.exists():
            print(f"FATAL: no instance {uri}", file=sys.stderr)
            return 255
        instance = json.loads(state.read_text())
        binds = [tuple(b) for b in instance["binds"]]
        options = argv[1 : argv.index(uri)]
        cwd = options[options.index("--pwd") + 1] if "--pwd" in options else "/"
        command = [translate(a, binds) for a in argv[argv.index(uri) + 1 :]]
        env = {k.removeprefix(PREFIX): translate(v, binds) for k, v in os.environ.items() if k.startswith(PREFIX)}
        path = os.environ.get("PATH", "/usr/bin:/bin")
        if "PREPEND_PATH" in env:
            path = f"{env.pop('PREPEND_PATH')}:{path}"
        env["PATH"] = path
        env["HOME"] = instance["home"]
        os.chdir(translate(cwd, binds))
        os.execvpe(command[0], command, env)
    print(f"fake apptainer: unsupported {argv}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
