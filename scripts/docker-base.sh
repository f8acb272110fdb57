#!/usr/bin/env bash
# The base image the Dockerfile builds on, made locally, for a machine whose engine
# cannot pull one: Debian bookworm (minbase) with Python 3.11, venv, CA certificates
# and libnuma (vLLM's CPU kernels link it). The Dockerfile's default base
# (python:3.11-slim-bookworm) is what a machine that can pull uses.
#
#   scripts/docker-base.sh [TAG]     (default inferbus-base:bookworm; as root)
set -euo pipefail
tag=${1:-inferbus-base:bookworm}
if docker image inspect "$tag" >/dev/null 2>&1; then
  echo "$tag: present"
  exit 0
fi
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates,libnuma1 \
  bookworm "$root" http://deb.debian.org/debian >/dev/null
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -c . | docker import -c 'CMD ["/bin/bash"]' -c 'ENV LANG=C.UTF-8' - "$tag"
echo "$tag: built"
