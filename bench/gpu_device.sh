#!/usr/bin/env bash
# bench/gpu_determinism.py on a lent GPU machine, as it was run on an NVIDIA H200 (2026-12-04).
#
#   bench/gpu_device.sh prepare   here, before the device call: the wheels the device's image lacks
#                                 into .whl/, SmolLM2's config and tokenizer into .dev/smollm2/
#                                 (both ignored by git through .git/info/exclude)
#   bench/gpu_device.sh run       on the device (carry .whl and .dev): install the wheels beside the
#                                 image's torch, run the script and the GPU-aware tests, and leave
#                                 gpu_determinism.json, log.txt, pytest.txt and g.tgz (records, logs,
#                                 traces; no weights) in $OUT. The script rewrites the JSON and says
#                                 one line as each phase ends, so a run cut by `timeout 430` still
#                                 leaves the phases it finished (and `stopped` in the JSON)
#
# The device runs its own stack (python3 with torch, transformers, PEFT), not the lock; the 98 MB
# GGUF is more than a call carries (64 MiB), so the model is SmolLM2's architecture with seeded
# random weights (--random-weights-from). About 5 minutes on one H200.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
    prepare)
        grep -qx '/.whl/' .git/info/exclude 2>/dev/null || printf '/.whl/\n/.dev/\n' >> .git/info/exclude
        platforms=()
        for p in manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
            platforms+=(--platform "$p")
        done
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            "${platforms[@]}" -d .whl pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 \
            typing-inspection==0.4.5 typing_extensions==4.16.0 gguf==0.19.0 chatterbot-corpus==1.3.3
        # The converted builtin model (made by any run of the quickstart) holds the config and tokenizer.
        model=$(ls -d "${REPROTUNE_CACHE_DIR:-$HOME/.cache/reprotune}"/models/smollm2-135m-instruct-* | head -1)
        mkdir -p .dev/smollm2
        for f in config.json generation_config.json tokenizer.json tokenizer_config.json chat_template.jinja; do
            cp "$model/$f" .dev/smollm2/
        done
        du -sh .whl .dev
        ;;
    run)
        : "${OUT:?run on the device machine, where OUT is set}"
        export PYTHONUNBUFFERED=1 MLFLOW_DISABLE_TELEMETRY=true HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site .whl/*.whl
        export PYTHONPATH="/tmp/site:$PWD/src"
        nvidia-smi --query-gpu=name,driver_version --format=csv || true
        set +e
        timeout 430 python3 bench/gpu_determinism.py --out /tmp/g --steps 40 --random-weights-from .dev/smollm2 \
            2>&1 | tee "$OUT/log.txt"
        script=${PIPESTATUS[0]}
        cp /tmp/g/gpu_determinism.json "$OUT/" 2>/dev/null
        timeout 80 python3 -m pytest -q -p no:cacheprovider tests/determinism/test_flags.py \
            tests/run/test_kernels.py tests/determinism/test_device.py tests/proof/test_op_tensors.py \
            tests/proof/test_trace_compare.py > "$OUT/pytest.txt" 2>&1
        tests=$?
        tail -3 "$OUT/pytest.txt"
        (cd /tmp/g && find . -name '*.safetensors' -o -name '*.bin' -o -name '*.pt' -o -name '*.pth' > /tmp/weights \
            && tar czf "$OUT/g.tgz" --exclude=./model -X /tmp/weights .)
        echo "script exit $script, tests exit $tests"
        [ "$script" = 0 ] && [ "$tests" = 0 ]
        ;;
    *)
        echo "usage: bench/gpu_device.sh prepare|run" >&2
        exit 2
        ;;
esac
