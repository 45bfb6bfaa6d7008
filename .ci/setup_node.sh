#!/usr/bin/env bash
# Node.js >= 20 with npm, for the harness CLIs (Debian's nodejs/npm packages are installed if node is missing).
# Its own step because two later steps need it: the harness installs, and the docker test image (which carries the
# shared libraries of the host's node). Idempotent: nothing is done when node is there.
set -euo pipefail

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "setup_node: installing Debian's nodejs and npm"
    SUDO=""
    if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends nodejs npm >/dev/null
fi
major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$major" -lt 20 ]; then
    echo "setup_node: node $(node --version) is too old (the harness CLIs need >= 20)" >&2
    exit 1
fi
echo "setup_node: node $(node --version), npm $(npm --version)"
