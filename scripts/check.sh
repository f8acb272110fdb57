#!/usr/bin/env bash
# The static checks CI runs before the tests (scripts/install.sh dev installs the tools):
#   ruff check, ruff format --check, and, on the package as installed (its files copied
#   to .typecheck/ as a wheel would place them: the editable install's import hook is
#   opaque to the tools), import-linter's layering contracts and mypy.
# mypy's paths are mapped back to the source tree (.typecheck/inferbus/services/x.py is
# services/x.py). Exits non-zero on the first check that fails.
set -euo pipefail
cd "$(dirname "$0")/.."
py=$(command -v python)

echo "== ruff check"; ruff check .
echo "== ruff format --check"; ruff format --check .

# setuptools reuses build/lib: a module moved or deleted since the last build would
# still be checked (and installed) from there
rm -rf .typecheck build
python -m pip install -q --no-deps --no-build-isolation --target .typecheck . 2>&1 \
  | { grep -v '^WARNING: Location' || true; }
cd .typecheck
echo "== import-linter"; lint-imports ../pyproject.toml --no-cache | sed -n '/^Contracts$/,$p'
echo "== mypy"
set +e
mypy -p inferbus --config-file ../pyproject.toml --python-executable "$py" \
  --cache-dir ../.mypy_cache 2>&1 \
  | sed -E 's#^inferbus/(contracts|shared|services)/#\1/#'
status=${PIPESTATUS[0]}
exit "$status"
