#!/usr/bin/env bash
# Fuzz every target of fuzz/ for a bounded time each (FUZZ_SECONDS, default 20), starting from the committed seed
# corpora. Fails when a target crashes, after running the others, and prints where the crashing input was saved.
# Builds on stable: no sanitizer (-s none), release with debug assertions and overflow checks.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

CARGO_FUZZ_VERSION=0.13.2
seconds="${FUZZ_SECONDS:-20}"
flags=(--release --debug-assertions --sanitizer none)

if [ "$(cargo fuzz --version 2>/dev/null)" != "cargo-fuzz $CARGO_FUZZ_VERSION" ]; then
  cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked
fi

build_started=$(date +%s)
cargo fuzz build "${flags[@]}"
echo "fuzz targets built in $(( $(date +%s) - build_started ))s"

# What a run finds goes to a scratch corpus (libFuzzer writes to the first directory it is given); the committed
# seeds are only read, so a run never dirties the tree.
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
failed=()
for target in $(cargo fuzz list); do
  mkdir -p "$scratch/$target"
  log="$scratch/$target.log"
  # -timeout: an input that takes this long is a hang (each takes milliseconds).
  if cargo fuzz run "${flags[@]}" "$target" "$scratch/$target" "corpus/$target" -- \
    -max_total_time="$seconds" -timeout=10 -print_final_stats=1 >"$log" 2>&1; then
    echo "$target: $(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1)"
  else
    failed+=("$target")
    tail -n 60 "$log"
    artifact="$(grep -oE 'Test unit written to [^ ]+' "$log" | tail -n 1 | awk '{print $NF}' || true)"
    echo "$target: FAILED; the input is ${artifact:-not saved (see the log above)}"
    echo "  reproduce: cd fuzz && cargo fuzz run ${flags[*]} $target ${artifact:-<input>}"
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzzing failed: ${failed[*]}"
  exit 1
fi
