#!/usr/bin/env bash
# The browser suite N times in a row on PostgreSQL + Redis (web and worker as separate
# processes) while two CPU-burning processes run beside it: the flakiness check the record
# relies on. Stops at the first failing round.
#   scripts/e2e_under_load.sh [rounds=5] [extra pytest args...]
# Needs DATABASE_URL (PostgreSQL; a scratch database is made per round) and REDIS_URL, as CI
# sets them; defaults to the local services.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
shift || true
export DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
export REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379/0}
export E2E_TOPOLOGY=split
export TOOLNEXUS_TEST_SQLITE_PATH=${TOOLNEXUS_TEST_SQLITE_PATH:-/tmp/toolnexus-e2e-load.sqlite3}

burners=()
for _ in 1 2; do
  python3 -c 'while True: pass' &
  burners+=($!)
done
trap 'kill "${burners[@]}" 2>/dev/null || true' EXIT
echo "CPU burners: ${burners[*]} on $(nproc) cores"

for round in $(seq 1 "$rounds"); do
  started=$(date +%s)
  if ./dev test tests/e2e -q -p no:cacheprovider "$@"; then
    echo "round $round/$rounds passed in $(( $(date +%s) - started )) s"
  else
    echo "round $round/$rounds FAILED" >&2
    exit 1
  fi
done
echo "$rounds rounds passed"
