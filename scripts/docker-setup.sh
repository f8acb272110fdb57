#!/usr/bin/env bash
# A Docker engine with Compose v2 on a Debian machine where none runs, as root: what CI
# does before the compose test. A machine that already has `docker compose` and a
# running engine is left as it is.
#
#   scripts/docker-setup.sh
#
# Debian bookworm's docker.io is the engine (20.10). Its docker-compose is Compose v1,
# which refuses the Compose Spec (`name:` at the top); Compose v2 is the static plugin
# in trixie's docker-compose package, fetched as a .deb and unpacked (nothing of trixie
# is installed).
set -euo pipefail

have_engine() { docker info >/dev/null 2>&1; }
have_compose() { docker compose version >/dev/null 2>&1; }

if ! command -v dockerd >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    docker.io debootstrap ca-certificates >/dev/null
fi
command -v debootstrap >/dev/null || \
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null

if ! have_compose; then
  work=$(mktemp -d) && chmod 755 "$work"   # apt downloads as _apt
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$work/lists" "$work/cache/archives/partial"
  echo "deb http://deb.debian.org/debian trixie main" > "$work/trixie.list"
  apt_trixie=(-o Dir::Etc::SourceList="$work/trixie.list" -o Dir::Etc::SourceParts=/dev/null
              -o Dir::State::Lists="$work/lists" -o Dir::Cache="$work/cache"
              -o APT::Get::List-Cleanup=0)
  apt-get "${apt_trixie[@]}" update -qq
  (cd "$work" && apt-get "${apt_trixie[@]}" download docker-compose >/dev/null)
  dpkg-deb -x "$work"/docker-compose_*.deb "$work/root"
  install -D -m 0755 "$work/root/usr/libexec/docker/cli-plugins/docker-compose" \
    /usr/local/lib/docker/cli-plugins/docker-compose
fi

if ! have_engine; then
  # a CLI found first on PATH may be another build than the engine's; both speak the API
  nohup dockerd >/var/log/dockerd.log 2>&1 &
  for _ in $(seq 60); do have_engine && break; sleep 1; done
  have_engine || { echo "dockerd did not start:"; tail -20 /var/log/dockerd.log; exit 1; }
  echo "dockerd runs in the background (log /var/log/dockerd.log); stop it with:"
  echo "  kill \$(cat /var/run/docker.pid)"
fi
docker compose version
