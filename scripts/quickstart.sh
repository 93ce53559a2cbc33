#!/usr/bin/env bash
# Install reprotune into .venv and run the main job on the embedded default:
# a LoRA fine-tune of SmolLM2-135M-Instruct on the English chatterbot corpus (examples/quickstart.yaml).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh
export MLFLOW_DISABLE_TELEMETRY=true HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv/bin/reprotune split builtin:chatterbot-en --stratify-by category --seed 42 --out split.json
.venv/bin/reprotune check-split split.json builtin:chatterbot-en
