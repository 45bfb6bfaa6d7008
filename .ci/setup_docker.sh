#!/usr/bin/env bash
# Make a Docker Engine answer here and build the local test image `polar-test-base:latest`.
#
# Idempotent: each step is skipped when its result is already there. Safe to run before every test run.
#   1. install Debian's docker.io if `dockerd` is missing (the docker CLI alone is not enough);
#   2. start dockerd in the background if `docker info` does not answer (log: $POLAR_DOCKERD_LOG);
#   3. build polar-test-base:latest if absent: no registry is reachable, so the image is a rootfs tarred from this
#      host's own Debian packages (bash, dash, coreutils, grep, sed, findutils, procps and the shared libraries they and
#      the host's `node` need, and git for refresh_runtime patches), then `docker import`-ed. Node itself is NOT in the
#      image: tests bind-mount a tools dir
#      holding the host's node at /polar/tools, which needs the same glibc/libstdc++ as the host, hence host libraries.
#
# dockerd flags used here, and why (this sandbox is a VM with cgroup v1, overlay2 on ext4 works):
#   --bridge=none --iptables=false --ip6tables=false
#       Polar's docker runtime defaults to host networking (the container reaches the gateway on 127.0.0.1);
#       no docker0 bridge, no private-range addresses, no iptables rules needed.
#   POLAR_DOCKERD_FLAGS adds more (e.g. "--storage-driver=vfs" where overlay mounts are refused).
#
# When no engine can be installed or started, the script says why, records the reason in $POLAR_DOCKER_UNAVAILABLE
# and exits 0: the `docker` tests then skip with that reason (and fail under CI when no such record exists).
set -euo pipefail

IMAGE="${POLAR_TEST_IMAGE:-polar-test-base:latest}"
LOG="${POLAR_DOCKERD_LOG:-/var/log/polar-dockerd.log}"
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi

UNAVAILABLE="${POLAR_DOCKER_UNAVAILABLE:-${XDG_CACHE_HOME:-$HOME/.cache}/polar/docker-unavailable}"

say() { echo "setup_docker: $*"; }
unavailable() {
    say "NO DOCKER ENGINE: $* (docker tests will skip)" >&2
    mkdir -p "$(dirname "$UNAVAILABLE")"
    echo "$*" >"$UNAVAILABLE"
    exit 0
}
rm -f "$UNAVAILABLE"

# 1. engine binaries
if ! command -v dockerd >/dev/null 2>&1; then
    say "installing docker.io"
    $SUDO apt-get update -q || unavailable "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends docker.io >/dev/null \
        || unavailable "apt-get install docker.io failed"
fi

# 2. a running daemon
if ! docker info >/dev/null 2>&1; then
    say "starting dockerd (log: $LOG)"
    # setsid: its own session and process group, so the daemon outlives the caller's (a killed test job, a CI step)
    # shellcheck disable=SC2086 # POLAR_DOCKERD_FLAGS is a list of flags
    $SUDO sh -c "setsid nohup dockerd --bridge=none --iptables=false --ip6tables=false ${POLAR_DOCKERD_FLAGS:-} >>'$LOG' 2>&1 &"
    for _ in $(seq 1 60); do
        if docker info >/dev/null 2>&1; then break; fi
        sleep 0.5
    done
    if ! docker info >/dev/null 2>&1; then
        tail -n 20 "$LOG" >&2 || true
        unavailable "dockerd did not answer within 30 s (log: $LOG)"
    fi
fi

# 3. the test image
# An image built by an older version of this script (without git, which refresh_runtime evaluation needs to move the
# agent's patch) is rebuilt.
if docker image inspect "$IMAGE" >/dev/null 2>&1; then
    if docker run --rm --network none "$IMAGE" git --version >/dev/null 2>&1; then
        say "$IMAGE present"
        exit 0
    fi
    say "$IMAGE lacks git: rebuilding"
    docker image rm -f "$IMAGE" >/dev/null
fi
say "building $IMAGE from host packages"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
list="$work/files"
packages=(libc6 libgcc-s1 libstdc++6 bash dash coreutils grep sed findutils procps git)
for pkg in "${packages[@]}"; do
    dpkg -L "$pkg" 2>/dev/null || dpkg -L "$pkg:amd64"
done | grep -v -E '^/usr/share/(doc|man|info|locale|lintian|bug|menu)|^/\.$|/gconv/' >"$list.pkg"
node_bin="$(command -v node || true)"
# shared libraries of every packaged ELF and of the host's node (node itself stays out of the image)
{
    while read -r f; do
        if [ -f "$f" ] && [ -x "$f" ] && [ ! -L "$f" ]; then echo "$f"; fi
    done <"$list.pkg"
    if [ -n "$node_bin" ]; then readlink -f "$node_bin"; fi
} | { xargs -r ldd 2>/dev/null || true; } | awk '/=> \//{print $3} /^\t\/lib/{print $1}' | sort -u >"$list.libs"
# every path (and the real file behind each symlinked library) made relative, existing entries only
{
    cat "$list.pkg" "$list.libs"
    while read -r lib; do readlink -f "$lib"; done <"$list.libs"
} | sort -u | while read -r f; do
    if [ -e "$f" ] || [ -L "$f" ]; then
        if [ -d "$f" ]; then continue; fi  # directories (and the usrmerge links) are made below
        # usrmerge: /bin, /lib, /lib64, /sbin are symlinks into /usr on the host and in the image
        real_dir="$(readlink -f "$(dirname "$f")")"
        echo "${real_dir#/}/$(basename "$f")"
    fi
done | sort -u >"$list"
root="$work/rootfs"
mkdir -p "$root"
tar -C / --no-recursion -cf - -T "$list" | tar -C "$root" -xf -
mkdir -p "$root"/{etc,tmp,root,home,proc,sys,dev,run,var/tmp,polar}
chmod 1777 "$root/tmp" "$root/var/tmp"
for link in bin lib lib64 sbin; do
    if [ -L "/$link" ]; then ln -sfn "usr/$link" "$root/$link"; fi
done
ln -sfn dash "$root/usr/bin/sh"
printf 'root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' >"$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$root/etc/nsswitch.conf"
tar -C "$root" -cf - . | docker import \
    --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin' \
    --change 'CMD ["/bin/bash"]' \
    - "$IMAGE" >/dev/null
say "built $IMAGE ($(du -sh "$root" | cut -f1) rootfs)"
