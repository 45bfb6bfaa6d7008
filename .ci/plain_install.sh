#!/usr/bin/env bash
# A fresh venv with `pip install -e .` only (no extras, no plugin packages): every command that needs no optional
# extra runs, and one that does names the extra in one line instead of a traceback.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${POLAR_PLAIN_VENV:-$(mktemp -d)/plain}"
python -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e .
polar="$VENV/bin/polar"
export POLAR_LOAD_PLUGINS=""   # the plugin packages of this checkout are not installed there anyway
"$polar" --version
"$polar" --help > /dev/null
"$polar" plugins > /dev/null
"$polar" plugins --json > /dev/null
for command in run serve generate export push-hub submit status proxy doctor harness; do
  "$polar" "$command" --help > /dev/null
done
# export needs pyarrow (the [hf] extra): one line naming the extra, exit 1, no traceback
work=$(mktemp -d)
set +e
"$polar" export "$work" --to "$work/out" > "$work/out.txt" 2> "$work/err.txt"
rc=$?
set -e
if [ "$rc" -eq 0 ] || grep -q Traceback "$work/err.txt" || ! grep -q "polar-rl\[hf\]" "$work/err.txt" \
   || [ "$(wc -l < "$work/err.txt")" -ne 1 ]; then
  echo "plain install: polar export should say in one line that it needs the [hf] extra; it printed:" >&2
  cat "$work/err.txt" >&2
  exit 1
fi
echo "plain install: polar --help, --version, plugins and every command's --help run; export names its extra:"
cat "$work/err.txt"
rm -rf "$work"
