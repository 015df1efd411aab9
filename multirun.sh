#!/usr/bin/env bash
# The campaign as Hydra multiruns, one phase after another, all tagged with one campaign id,
# then the report (experiment=report) over that campaign's runs.
#
#   ./multirun.sh                                   # the embedded default (CPU, gloo, local MLflow, tiny_kimi)
#   ./multirun.sh hardware=rtx_pro_6000_x8_pcie model=kimi_k25_int4 server.model_path=/models/Kimi-K2.5
#                                                   # extra args go to every phase as overrides
#   PHASES="nccl_burst all_to_all" ./multirun.sh    # a subset of phases
#   ./multirun.sh debug=quick macro:experiment.concurrency=[1,2]
#                                                   # PHASE:override goes to that phase only
#   ./multirun.sh profile:experiment.concurrency=1,4  # ... and replaces the phase's own sweep
#                                                   # of that key
#
# Environment: K25EXP_CAMPAIGN (default: campaign-<UTC time>), MLFLOW_TRACKING_URI (default:
# outputs/mlflow.db), PYTHON (default: .venv/bin/python if present, else python3).
# A phase that fails does not stop the others; the exit status says whether any failed.
set -uo pipefail
cd "$(dirname "$0")"

if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export K25EXP_CAMPAIGN="${K25EXP_CAMPAIGN:-campaign-$(date -u +%Y%m%dT%H%M%SZ)}"

# Phases and their sweeps come from the experiment schemas (campaign_order, campaign_sweep in
# k25exp/config/schema.py): `python -m k25exp.config.campaign` lists them.
declare -A SWEEP=()
all_phases=()
while IFS=$'\t' read -r name args; do
  SWEEP[$name]="$args"; all_phases+=("$name")
done < <("$PYTHON" -m k25exp.config.campaign)
if (( ${#all_phases[@]} == 0 )); then
  echo "multirun.sh: could not list the campaign's phases with $PYTHON -m k25exp.config.campaign" >&2
  exit 2
fi
PHASES="${PHASES:-${all_phases[*]}}"

# A campaign keeps one model across its phases. Unless one is given, it is the embedded
# default's servable model (tiny_kimi), so the collective and GEMM phases measure the sizes
# of the model the macro and profile phases serve.
model_given=0
for a in "$@"; do [[ "$a" == model=* ]] && model_given=1; done
(( model_given )) || set -- model=tiny_kimi "$@"

# PHASE:override arguments go to that phase only; the rest to every phase.
common=()
declare -A only=()
for a in "$@"; do
  p="${a%%:*}"
  if [[ "$a" == *:* && "$p" != *=* && -n "${SWEEP[$p]+set}" ]]; then
    only[$p]+="${a#*:}"$'\n'
  elif [[ "$a" == *:* && "$p" =~ ^[A-Za-z_]*$ ]]; then  # looks like PHASE:..., no such phase
    echo "multirun.sh: '$a': no phase '$p' (known: ${!SWEEP[*]})" >&2
    exit 2
  else
    common+=("$a")
  fi
done

ok=() failed=()
t_start=$(date +%s)
report_log=$(mktemp)
trap 'rm -f "$report_log"' EXIT
for phase in $PHASES; do
  if [[ -z "${SWEEP[$phase]+set}" ]]; then
    echo "multirun.sh: unknown phase '$phase' (known: ${!SWEEP[*]})" >&2
    failed+=("$phase"); continue
  fi
  echo "=== phase $phase (campaign $K25EXP_CAMPAIGN)"
  mapfile -t extra < <(printf '%s' "${only[$phase]:-}")
  set -- "${common[@]}" ${extra[@]+"${extra[@]}"}  # (bash < 4.4: empty arrays and set -u)
  if [[ "$phase" == report ]]; then
    # One job; its last lines say where the report is.
    "$PYTHON" -m k25exp experiment=report "$@" | tee "$report_log"
    rc=${PIPESTATUS[0]}
  else
    # The phase's sweep, less any key a PHASE:key=... argument sets (it replaces that entry:
    # `profile:experiment.concurrency=1,4` sweeps 1 and 4 instead of 1, 8, 32).
    sweep=()
    for s in ${SWEEP[$phase]}; do
      replaced=0
      for e in ${extra[@]+"${extra[@]}"}; do [[ "${e%%=*}" == "${s%%=*}" ]] && replaced=1; done
      (( replaced )) || sweep+=("$s")
    done
    "$PYTHON" -m k25exp -m "experiment=$phase" ${sweep[@]+"${sweep[@]}"} "$@"
    rc=$?
  fi
  if (( rc == 0 )); then ok+=("$phase"); else failed+=("$phase"); fi
done

elapsed=$(( $(date +%s) - t_start ))
echo "=== campaign $K25EXP_CAMPAIGN: ${#ok[@]} phase(s) ok${ok:+ (${ok[*]})}, ${#failed[@]} failed${failed:+ (${failed[*]})}; $((elapsed / 60)) min $((elapsed % 60)) s"
grep -E '^report( \(markdown\))?: ' "$report_log" 2>/dev/null | sed 's/^/    /'
echo "    open MLflow: $PYTHON -m k25exp ui   (then filter runs by tags.campaign = '$K25EXP_CAMPAIGN')"
[[ ${#failed[@]} -eq 0 ]]
