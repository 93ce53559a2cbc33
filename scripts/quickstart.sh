#!/usr/bin/env bash
# Install reprotune into .venv and run the main job on the embedded default: audit the setup, run a
# LoRA fine-tune of SmolLM2-135M-Instruct on the English chatterbot corpus (examples/quickstart.yaml),
# then verify it: a rerun in a fresh process, a resume from a checkpoint, and negative controls; then
# evaluate it on 32 test rows (reprotune eval) and write an HTML report.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh
export MLFLOW_DISABLE_TELEMETRY=true HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
run="runs/quickstart-$(date -u +%Y%m%d-%H%M%S)"
.venv/bin/reprotune doctor examples/quickstart.yaml
.venv/bin/reprotune run examples/quickstart.yaml --run-dir "$run"
.venv/bin/reprotune verify examples/quickstart.yaml --reference "$run" --out "$run-verify"
# 32 test rows, generated batch-size-invariantly and scored (BLEU, chrF, ROUGE): RUN/evals/<id>/
.venv/bin/reprotune eval "$run" --max-rows 32 --set eval.max_new_tokens=32
# the verification directory: what was proven, then the reference and every leg against it
.venv/bin/reprotune report "$run-verify" -o "$run-report.html"
echo "report: $run-report.html"
