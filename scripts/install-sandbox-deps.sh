#!/usr/bin/env bash
# Install what the sandbox backends need on Debian/Ubuntu: bubblewrap for the local backend;
# with --docker also docker.io (the engine) and debootstrap (to build a base image offline);
# with --browser also chromium (Debian's, driven by Playwright in the browser tests).
# With --image, build the docker backend's default image (agentrl/bookworm-python: Debian
# bookworm minbase + python3, git, procps) with debootstrap + docker import, once; it needs a
# running dockerd and a reachable Debian mirror, and caches the root filesystem under
# $AGENTRL_CACHE (default /var/cache/agentrl).
# Idempotent and quiet: what is already present is skipped. Needs root (or sudo).
set -euo pipefail

usage="usage: $0 [--docker] [--image] [--browser]"
want_docker=0
want_image=0
want_browser=0
for arg in "$@"; do
  case "$arg" in
    --docker) want_docker=1 ;;
    --image) want_image=1; want_docker=1 ;;
    --browser) want_browser=1 ;;
    -h|--help) echo "$usage"; exit 0 ;;
    *) echo "unknown argument: $arg ($usage)" >&2; exit 2 ;;
  esac
done

build_image() {
  local image="agentrl/bookworm-python:latest"
  local cache="${AGENTRL_CACHE:-/var/cache/agentrl}"
  local rootfs="$cache/rootfs-bookworm-python"
  local mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
  if ! docker info >/dev/null 2>&1; then
    echo "sandbox deps: dockerd is not running; start it (e.g. dockerd --bridge=none --iptables=false &) and rerun" >&2
    return 1
  fi
  if docker image inspect "$image" >/dev/null 2>&1; then
    echo "sandbox deps: image $image already present"
    return 0
  fi
  if [ ! -x "$rootfs/usr/bin/python3" ]; then
    echo "sandbox deps: debootstrap bookworm into $rootfs"
    mkdir -p "$cache"
    rm -rf "$rootfs.partial"
    debootstrap --variant=minbase --include=python3,git,procps bookworm "$rootfs.partial" "$mirror" >/dev/null
    rm -rf "$rootfs.partial"/var/cache/apt/archives/*.deb "$rootfs.partial"/var/lib/apt/lists/*
    mv "$rootfs.partial" "$rootfs"
  fi
  tar -C "$rootfs" -c . | docker import -c 'CMD ["/bin/bash"]' - "$image" >/dev/null
  echo "sandbox deps: built $image"
}

need=()
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
if [ "$want_docker" = 1 ]; then
  command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
  command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
fi
if [ "$want_browser" = 1 ]; then
  command -v chromium >/dev/null 2>&1 || need+=(chromium)
  command -v setpriv >/dev/null 2>&1 || need+=(util-linux)  # runs chromium as nobody under root
fi

if [ "${#need[@]}" -eq 0 ]; then
  echo "sandbox deps: packages already installed"
  if [ "$want_image" = 1 ]; then build_image; fi
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
  echo "sandbox deps: apt-get not found; install ${need[*]} with your package manager" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "sandbox deps: need root to install ${need[*]}" >&2; exit 1; }
  SUDO="sudo"
fi

export DEBIAN_FRONTEND=noninteractive
echo "sandbox deps: installing ${need[*]}"
if ! $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; then
  $SUDO apt-get update -qq >/dev/null
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
command -v bwrap >/dev/null 2>&1 && echo "sandbox deps: $(bwrap --version)"
if [ "$want_image" = 1 ]; then build_image; fi
