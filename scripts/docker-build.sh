#!/usr/bin/env bash
# Build the inferbus image on a machine whose Docker engine cannot pull: a local base
# (scripts/docker-base.sh) and a wheelhouse this machine's pip fills (deploy/wheels/),
# so the build installs offline. Where the engine can pull, a plain `docker build`
# (or `docker compose build`) needs none of this.
#
#   scripts/docker-build.sh [ENGINE]      cpu (default) or none; tags inferbus:ENGINE
set -euo pipefail
cd "$(dirname "$0")/.."
engine=${1:-cpu}
base=inferbus-base:bookworm
scripts/docker-base.sh "$base"

spec=.
[ "$engine" = none ] || spec=".[$engine]"
# pip download resolves as an install would (this machine's own wheels included) and
# keeps what it has; the project's build backend comes along for the offline build
echo "== wheels for $spec into deploy/wheels/ (a cache the next build reuses)"
python3 -m pip download -q -d deploy/wheels "$spec" "setuptools>=70.1" wheel

# the steps print as they run: with the engine's wheels this takes minutes
echo "== building inferbus:$engine"
DOCKER_BUILDKIT=0 docker build -f deploy/Dockerfile --network host \
  --build-arg BASE="$base" --build-arg ENGINE="$engine" --build-arg PIP_NO_INDEX=1 \
  -t "inferbus:$engine" .
echo "== built inferbus:$engine. Left behind: deploy/wheels/ ($(du -sh deploy/wheels | cut -f1),"
echo "   rm -rf deploy/wheels/*.whl deploy/wheels/*.tar.gz to reclaim it) and the untagged"
echo "   build stage (docker image prune removes dangling images)"
