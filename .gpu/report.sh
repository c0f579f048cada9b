#!/usr/bin/env bash
# GPU evidence (issue 33) on a lent GPU machine that has Python 3.12, torch and triton of its own but
# reaches no package registry: what vecmarl needs beyond them travels as wheels.
#
#   .gpu/report.sh wheels              here, before the GPU session: the wheels into .whl/ (ignored by git)
#   .gpu/report.sh run OUT [MINUTES]   on the GPU machine, with .whl/ beside it: install them into a scratch
#                                      folder and run `python -m marl.bench.gpu_report` (8 minutes by default);
#                                      OUT gets report.json, report.txt and logs.tar.gz (every step's log)
#   .gpu/report.sh dry OUT [MINUTES]   anywhere, no GPU or wheels needed: say what `run` would install and run,
#                                      and write OUT/report.txt listing the steps (`gpu_report --dry`)
#
# The machine's own torch, triton, numpy, scipy, cloudpickle, six and typing-extensions are used. The pins
# below are the versions vecmarl was tested with on torch 2.11 and triton 3.6 (see the README's GPU
# section); tensordict 0.15 is the first release that supports torch 2.11.
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=${VECMARL_WHEELS:-.whl} # ignored by git (.gitignore)
PYTHON=${PYTHON:-python3}
PUBLISHED_AS_WHEELS=(
    tensordict==0.15.3 pyvers==0.2.3                               # tensordict
    pettingzoo==1.27.0 gymnasium==1.4.0 farama-notifications==0.0.6 # PettingZoo
    mpe2==1.1.1 pygame-ce==2.5.8                                   # MPE2
    pyglet==1.5.27 gym-notices==0.0.8                              # VMAS
)
PUBLISHED_AS_SOURCE=(vmas==1.5.2 gym==0.26.2) # pure Python: built here into wheels

wheels() {
    rm -rf "$WHEELS"
    mkdir -p "$WHEELS"
    # --no-deps: the dependencies are listed above, and torch (several GB) stays the machine's own.
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$WHEELS" "${PUBLISHED_AS_WHEELS[@]}"
    python3 -m pip wheel -q --no-deps --no-binary=:all: -w "$WHEELS" "${PUBLISHED_AS_SOURCE[@]}"
    echo "wheels: $(find "$WHEELS" -type f -name '*.whl' | wc -l) in $WHEELS/, $(du -sh "$WHEELS" | cut -f1)"
}

check_minutes() {
    if ! [[ $1 =~ ^[0-9]*\.?[0-9]+$ ]] || ! awk "BEGIN { exit !($1 > 0) }"; then
        echo "MINUTES $1: expected a positive number of minutes (the budget of every step together)" >&2
        exit 2
    fi
}

dry() {
    local out=${1:?usage: .gpu/report.sh dry OUT [MINUTES]} minutes=${2:-8}
    check_minutes "$minutes"
    local found
    found=$(find "$WHEELS" -maxdepth 1 -name '*.whl' 2>/dev/null | sort) || true # no folder yet: none
    if [ -z "$found" ]; then
        echo "dry run: no wheels in $WHEELS/ yet: 'run' would stop there ('.gpu/report.sh wheels' downloads them)"
    else
        echo "dry run: 'run' would install these $(echo "$found" | wc -l) wheels into a scratch folder (--no-deps):"
        echo "$found" | sed 's|^|    |'
    fi
    echo "dry run: then $PYTHON -m marl.bench.gpu_report REPORT --minutes $minutes, and copy report.json, report.txt"
    echo "         and logs.tar.gz from REPORT into OUT; its steps, not run here:"
    "$PYTHON" -m marl.bench.gpu_report "$out" --minutes "$minutes" --dry
    sed -n '/^| step/,$p' "$out/report.txt"
}

run() {
    local out=${1:?usage: .gpu/report.sh run OUT [MINUTES]} minutes=${2:-8}
    check_minutes "$minutes"
    if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
        echo "no wheels in $WHEELS/: run '.gpu/report.sh wheels' before the GPU session and carry $WHEELS" >&2
        exit 2
    fi
    local scratch site report
    scratch=$(mktemp -d)
    site="$scratch/site" report="$scratch/report"
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$WHEELS"/*.whl
    export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    local status=0
    "$PYTHON" -m marl.bench.gpu_report "$report" --minutes "$minutes" || status=$?
    # Few files come back from the machine: the two reports, and every log (no checkpoints) in one archive.
    mkdir -p "$out"
    cp "$report/report.json" "$report/report.txt" "$out/"
    tar -czf "$out/logs.tar.gz" -C "$report" --exclude='*.pt' .
    echo "gpu report: $out/report.txt, logs in $out/logs.tar.gz"
    return "$status"
}

case "${1:-}" in
wheels) wheels ;;
run)
    shift
    run "$@"
    ;;
dry)
    shift
    dry "$@"
    ;;
*)
    echo "usage: .gpu/report.sh wheels | .gpu/report.sh run OUT [MINUTES] | .gpu/report.sh dry OUT [MINUTES]" >&2
    exit 2
    ;;
esac
