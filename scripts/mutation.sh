#!/usr/bin/env bash
# Mutation score of one module with mutmut 3 (a developer tool, not part of CI). See docs/testing.md.
#
#   scripts/mutation.sh overinterp_fast/methods/findsis.py python_tests/methods/test_boundaries.py python_tests/runtime/test_schedule.py
#
# Copies the tracked tree (and the built extension) to a scratch folder, adds a [tool.mutmut] section
# that mutates only the given module and runs only the given tests, runs `mutmut run`, and prints
# the counts, the score and the surviving mutants. Score = detected / reached, where detected = killed
# (a test failed) + timeout (the mutant made a test hang; pytest-timeout is off here, mutmut's own limit
# applies) and reached = every mutant except those no selected test executes ("no tests").
# MUTATION_DIR (default /tmp/overinterp-mutation) holds the copies; MUTATION_JOBS (default 2) workers;
# MUTATION_TIMEOUT (default 2.0) is mutmut's timeout_multiplier: a mutant that hangs is stopped after
# 2 x MUTATION_TIMEOUT x (the selected tests' own time + 1 s) of CPU (mutmut's default of 15 lets each
# hanging mutant of a `while True` loop run for a quarter of an hour on a loaded machine).
# MUTANTS (optional): mutant names or fnmatch patterns (space-separated) to run only those, e.g. the survivors of
# an earlier run with new tests: MUTANTS="overinterp_fast.runtime.incremental.x__channel_pad__mutmut_*". The score then
# counts only the mutants run ("not checked" ones are left out).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY=python3
MOD="$1"; shift
[ $# -gt 0 ] || { echo "usage: $0 MODULE.py TEST_FILE_OR_NODE..." >&2; exit 2; }
NAME="$(echo "${MOD#overinterp_fast/}" | tr '/' '_' | sed 's/\.py$//')"
WORK="${MUTATION_DIR:-/tmp/overinterp-mutation}/$NAME"
rm -rf "$WORK"; mkdir -p "$WORK"
(cd "$ROOT" && git ls-files -co --exclude-standard overinterp_fast python_tests pyproject.toml setup.py \
   | tar -cf - -T - ; ls overinterp_fast/_C*.so >/dev/null 2>&1 && tar -cf - overinterp_fast/_C*.so) \
   | (cd "$WORK" && tar -xif -)
tests=$(printf '"%s", ' "$@")
cat >> "$WORK/pyproject.toml" <<TOML

[tool.mutmut]
source_paths = ["overinterp_fast/"]
only_mutate = ["$MOD"]
also_copy = ["python_tests/"]
pytest_add_cli_args_test_selection = [${tests%, }]
pytest_add_cli_args = ["-p", "no:cacheprovider", "-p", "no:timeout", "-q", "-x"]
process_isolation = "forkserver"
timeout_multiplier = ${MUTATION_TIMEOUT:-2.0}
TOML
cd "$WORK"
# shellcheck disable=SC2086  # MUTANTS is a list of patterns
"$PY" -m mutmut run --max-children "${MUTATION_JOBS:-2}" ${MUTANTS:-} > run.log 2>&1 || { tail -30 run.log; exit 1; }
"$PY" -m mutmut results --all true > results.txt 2>&1 || true
"$PY" - "$MOD" <<'PY'
import collections, re, sys
counts = collections.Counter()
for line in open("results.txt"):
    m = re.match(r"\s*(\S+): (.+)$", line)
    if m:
        counts[m.group(2).strip()] += 1
killed = counts.get("killed", 0) + counts.get("timeout", 0)
total = sum(counts.values()) - counts.get("no tests", 0) - counts.get("skipped", 0) - counts.get("not checked", 0)
print(f"{sys.argv[1]}: {dict(counts)}")
print(f"{sys.argv[1]}: score {killed}/{total} = {killed / max(total, 1):.1%} detected "
      f"(no tests: {counts.get('no tests', 0)})")
PY
grep -E ": (survived|no tests|timeout|suspicious)" results.txt || true
