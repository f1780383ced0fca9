#!/usr/bin/env bash
# The GPU device check: on a machine with an NVIDIA GPU, CUDA's compiler and Python 3.12, and no
# network. First, here: `python bench/gpu/prepare.py` (writes .gpu/). Then, with the device tool:
#
#   run  carry [".gpu"]  timeout_s 590  command "bash bench/gpu/device_check.sh"
#
# Steps (each line of progress says the elapsed seconds, so a cut-off run still says where it was):
#   1. runner's missing Python dependencies from .gpu/wheels; llama.cpp's source from .gpu/
#   2. one CMake build of the pinned llama.cpp with CUDA for this GPU's architecture only: the
#      shared libraries runner loads (LLAMA_CPP_LIB_PATH) and llama-server, llama-quantize
#   3. a model with SmolLM2-135M's shapes and random weights (bench/gpu/write_model.py), quantized
#      to Q4_1 (as the default model) and F16, and a 4x deep twin of the F16 (bench/deep_twin.py)
#   4. runner info on it (devices, placement), the tests marked gpu
#   5. runner's server against llama-server on the GPU (1, 8, 32 clients; a long-prompt row for
#      prefill), speculation (draft model: the F16 drafting for its twin; n-gram) against off
# Results: $OUT/gpu_check.md (the tables), $OUT/check.log. It keeps to GPU_CHECK_BUDGET_S seconds
# (default 570, inside one 600 s call): a bench that would not finish in what is left is skipped
# and named in the report. GPU_CHECK_REPEATS (default 2): pairs per row.
# GPU_CHECK_CUDA=OFF builds for the CPU instead (a dry run of the script where there is no GPU).
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
OUT="${OUT:-/tmp/gpu-check-out}"
WORK="${GPU_CHECK_WORK:-/tmp/gpu-check}"
CUDA="${GPU_CHECK_CUDA:-ON}"
PY="${PYTHON:-python3}"
BUDGET="${GPU_CHECK_BUDGET_S:-570}"
REPEATS="${GPU_CHECK_REPEATS:-2}"
mkdir -p "$OUT" "$WORK"
exec > >(tee -a "$OUT/check.log") 2>&1
step() { echo "== [${SECONDS}s] $*"; }
# time_for SECONDS WHAT: whether WHAT (about SECONDS long) fits in what is left of the budget
time_for() { if [ $((BUDGET - SECONDS)) -ge "$1" ]; then return 0; fi
             echo "== [${SECONDS}s] skipped (needs ~$1 s, $((BUDGET - SECONDS)) s left): $2"
             report ""; report "(skipped for time: $2)"; return 1; }
fail() { echo "== [${SECONDS}s] FAILED: $*"; exit 1; }
REPORT="$OUT/gpu_check.md"
report() { echo "$*" >> "$REPORT"; }
: > "$REPORT"

step "1. Python dependencies and llama.cpp's source"
[ -f .gpu/llama.cpp.tar.gz ] || fail ".gpu/ is missing: run python bench/gpu/prepare.py here first and carry .gpu"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/site" .gpu/wheels/*.whl \
  || fail "installing .gpu/wheels"
[ -d "$WORK/llama.cpp" ] || tar -xzf .gpu/llama.cpp.tar.gz -C "$WORK" || fail "unpacking llama.cpp"
export PYTHONPATH="$WORK/site:$WORK:$REPO"   # runner's dependencies, llama_cpp (the Python package), runner
nvidia-smi --query-gpu=name,memory.total,memory.free,compute_cap --format=csv 2>/dev/null || echo "(no nvidia-smi)"

step "2. build llama.cpp (CUDA $CUDA)"
ARCH="${GPU_CHECK_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '.')}"
ARCH="${ARCH:-90}"
GEN=(); command -v ninja > /dev/null && GEN=(-G Ninja)
if [ ! -f "$WORK/build/CMakeCache.txt" ]; then
  cmake -S "$WORK/llama.cpp" -B "$WORK/build" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DGGML_CUDA="$CUDA" -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF > "$WORK/cmake.log" 2>&1 \
    || { tail -30 "$WORK/cmake.log"; fail "cmake configure"; }
fi
cmake --build "$WORK/build" -j "$(nproc)" --target llama llama-server llama-quantize > "$WORK/build.log" 2>&1 \
  || { tail -40 "$WORK/build.log"; fail "build"; }
BIN="$WORK/build/bin"
export LLAMA_CPP_LIB_PATH="$BIN"
ls "$BIN" | tr '\n' ' '; echo
step "built"

step "3. models"
MODELS="$WORK/models"; mkdir -p "$MODELS"
if [ ! -f "$MODELS/shape.Q4_1.gguf" ]; then
  "$PY" bench/gpu/write_model.py "$MODELS/shape.F32.gguf" || fail "writing the model"
  "$BIN/llama-quantize" "$MODELS/shape.F32.gguf" "$MODELS/shape.Q4_1.gguf" Q4_1 > /dev/null 2>&1 || fail "quantize Q4_1"
  "$BIN/llama-quantize" "$MODELS/shape.F32.gguf" "$MODELS/shape.F16.gguf" F16 > /dev/null 2>&1 || fail "quantize F16"
  rm -f "$MODELS/shape.F32.gguf"
  "$PY" bench/deep_twin.py --source "$MODELS/shape.F16.gguf" --copies 4 || echo "(no deep twin)"
fi
ls -la "$MODELS"
export RUNNER_CACHE_DIR="$WORK/cache"

step "4. runner info and the GPU tests"
"$PY" -m runner info "$MODELS/shape.Q4_1.gguf" | tee "$OUT/info.txt"
report "## GPU device check ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), CUDA $CUDA, arch $ARCH)"
report ""
report '```'
grep -E "^(device|gpu layers)" "$OUT/info.txt" >> "$REPORT"
report '```'
"$PY" -m pytest -q -p no:cacheprovider -m gpu tests/gpu -rs 2>&1 | tail -15 | tee "$OUT/gpu_tests.txt"
report ""
report "GPU tests: $(tail -1 "$OUT/gpu_tests.txt")"

THREADS=8
step "5a. runner vs llama-server on the GPU"
if time_for 150 "runner vs llama-server"; then
  "$PY" bench/vs_llama_server.py --model "$MODELS/shape.Q4_1.gguf" --llama-server "$BIN/llama-server" \
    --concurrency 1 8 32 --repeats "$REPEATS" --rounds 2 --max-tokens 128 --ctx-per-slot 1024 --threads "$THREADS" \
    --gpu-layers all 2>&1 | tee "$OUT/vs_llama_server.txt"
  report ""
  report "### runner vs llama-server (Q4_1, SmolLM2-135M's shapes, random weights, all layers on the GPU)"
  report ""
  sed -n '/^model /,$p' "$OUT/vs_llama_server.txt" >> "$REPORT"
fi

step "5b. prefill: long prompts, one token each"
if time_for 60 "prefill"; then
  "$PY" bench/vs_llama_server.py --model "$MODELS/shape.Q4_1.gguf" --llama-server "$BIN/llama-server" \
    --concurrency 1 8 --repeats "$REPEATS" --rounds 2 --max-tokens 1 --ctx-per-slot 4096 --prompt-repeat 40 \
    --threads "$THREADS" --gpu-layers all 2>&1 | tee "$OUT/prefill.txt"
  report ""
  report "### prefill (each prompt x40, ~1,500 tokens; TTFT is the prefill)"
  report ""
  sed -n '/^model /,$p' "$OUT/prefill.txt" >> "$REPORT"
fi

step "5c. speculation against off (stand-in pair: the F16 drafting for its 4x deep twin; n-gram)"
TWIN="$(ls "$MODELS"/*twin4*.gguf 2>/dev/null | head -1)"
if [ -n "$TWIN" ] && time_for 90 "speculation"; then
  "$PY" bench/speculative.py --target "$TWIN" --drafts "$MODELS/shape.F16.gguf" ngram --spec on auto \
    --workloads "free chat" --concurrency 1 8 --repeats 1 --max-tokens 64 --threads "$THREADS" --skip-padded 2>&1 \
    | tee "$OUT/speculative.txt"
  report ""
  report "### speculation on the GPU (stand-in: a 4x deep twin of the random model, drafted by the model itself)"
  report ""
  sed -n '/^| workload/,$p' "$OUT/speculative.txt" >> "$REPORT"
fi
step "done: $REPORT"
cat "$REPORT"
