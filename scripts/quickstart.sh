#!/usr/bin/env bash
# The built-in default job: set up (idempotent), generate the quickstart data,
# validate and plan the quickstart recipe, then train it on CPU in one process
# and print its eval AUC next to the data set's best achievable AUC.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-3}
E=.venv/bin/embtrain
RECIPE=recipes/quickstart.yaml
# Generate the data unless data/quickstart already holds it for this very recipe.
if ! .venv/bin/python - "$RECIPE" <<'PY' 2>/dev/null
import json, sys
from embtrain.recipe import load_recipe, recipe_fingerprint
info = json.load(open("data/quickstart/dataset.json"))
ok = info["source"]["fingerprint"] == recipe_fingerprint(load_recipe(sys.argv[1])) and info["rows"]["train"] == 800000
sys.exit(0 if ok else 1)
PY
then
  $E gen-data --recipe "$RECIPE" --out data/quickstart --rows 800000 --overwrite
fi
$E validate "$RECIPE"
$E plan "$RECIPE"
$E run "$RECIPE" "$@"
