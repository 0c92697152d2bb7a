#!/usr/bin/env bash
# The static gates (CI runs them from scripts/test.sh; .pre-commit-config.yaml runs the same
# tools on a contributor's commit): ruff lint and format, cython-lint, clang-format, mypy on
# comm/, transport/ and kit/, and the import layering (lint-imports; pyproject.toml holds every
# tool's settings).  The tools live in .venv-lint at pinned versions.
source "$(dirname "$0")/_setup.sh"
LINT_TOOLS=(ruff==0.17.6 cython-lint==0.22.1 pycodestyle==2.15.0 clang-format==23.1.5 mypy==2.4.1
            import-linter==2.17)
[ -x .venv-lint/bin/python ] || "$PY" -m venv .venv-lint
.venv-lint/bin/pip install "${PIP_FLAGS[@]}" "${LINT_TOOLS[@]}"
export PATH="$ROOT/.venv-lint/bin:$PATH"  # cython-lint runs pycodestyle by name
status=0
gate() {  # gate NAME COMMAND...: run it, say how it went
    local name=$1
    shift
    if "$@"; then echo "gate $name: ok"; else echo "gate $name: FAILED"; status=1; fi
}
mapfile -t PYX < <(git ls-files '*.pyx')
mapfile -t CSRC < <(git ls-files '*.c' '*.h' '*.cu' '*.cuh')
gate "ruff check" ruff check --quiet .
gate "ruff format" ruff format --check --quiet .
gate "cython-lint" cython-lint --max-line-length 120 "${PYX[@]}"
gate "clang-format" clang-format --style=file --dry-run -Werror "${CSRC[@]}"
gate "mypy" mypy
gate "import layers" env PYTHONPATH="$ROOT/core" lint-imports --no-cache
exit $status
