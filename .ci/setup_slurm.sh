#!/usr/bin/env bash
# Slurm on this host for tests/deploy/test_slurm.py: Debian's slurm-wlm and munge, and a running munged.
#
# Idempotent and fast when done: each step is skipped when its result is already there.
#   1. install slurm-wlm and munge from Debian if slurmctld, slurmd, sbatch or munged is missing;
#   2. a munge key (the package makes one; made here if it did not);
#   3. munged running as the munge user (its socket in /run/munge).
# slurmctld and slurmd are not started here: the test writes its own slurm.conf (loopback, one node, its own state
# and spool dirs under its tmp dir) and starts and stops both daemons with it.
#
# When Slurm cannot be installed or munged cannot start, the script says why, records the reason in
# $POLAR_SLURM_UNAVAILABLE and exits 0: the Slurm test then skips with that reason (and fails under CI when no such
# record exists).
set -euo pipefail

SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
UNAVAILABLE="${POLAR_SLURM_UNAVAILABLE:-${XDG_CACHE_HOME:-$HOME/.cache}/polar/slurm-unavailable}"

say() { echo "setup_slurm: $*"; }
unavailable() {
    say "NO SLURM: $* (the Slurm test will skip)" >&2
    mkdir -p "$(dirname "$UNAVAILABLE")"
    echo "$*" >"$UNAVAILABLE"
    exit 0
}
rm -f "$UNAVAILABLE"

# 1. the packages
missing=0
for tool in slurmctld slurmd sbatch munged; do
    command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/sbin/$tool" ] || missing=1
done
if [ "$missing" = 1 ]; then
    say "installing slurm-wlm and munge"
    $SUDO apt-get update -q >/dev/null || unavailable "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null \
        || unavailable "apt-get install slurm-wlm munge failed"
fi

# 2. the key
if [ ! -s /etc/munge/munge.key ]; then
    say "making a munge key"
    $SUDO mkdir -p /etc/munge
    $SUDO dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=128 status=none
    $SUDO chown munge:munge /etc/munge/munge.key
    $SUDO chmod 0400 /etc/munge/munge.key
fi

# 3. the daemon
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    say "starting munged"
    $SUDO mkdir -p /run/munge /var/log/munge /var/lib/munge
    $SUDO chown munge:munge /run/munge /var/log/munge /var/lib/munge
    $SUDO runuser -u munge -- /usr/sbin/munged || unavailable "munged did not start"
    for _ in $(seq 1 20); do
        if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then break; fi
        sleep 0.25
    done
    munge -n 2>/dev/null | unmunge >/dev/null 2>&1 || unavailable "munged does not answer"
fi
say "$(slurmd -V) and munged ready"
