#!/usr/bin/env bash
# The campaign as Hydra multiruns, one phase after another, all tagged with one campaign id,
# then the report (experiment=report) over that campaign's runs.
#
#   ./multirun.sh                                   # the embedded default (CPU, gloo, local MLflow, tiny_kimi)
#   ./multirun.sh hardware=rtx_pro_6000_x8_pcie model=kimi_k25_int4 server.model_path=/models/Kimi-K2.5
#                                                   # extra args go to every phase whose config
#                                                   # has their key: server.* to the phases that
#                                                   # drive a server (macro, profile, spec_decode),
#                                                   # experiment.input_tokens=... to those whose
#                                                   # experiment has it; a line says what another
#                                                   # phase was not given, naming the key
#   PHASES="nccl_burst all_to_all" ./multirun.sh    # a subset of phases
#   ./multirun.sh debug=quick macro:experiment.concurrency=[1,2]
#                                                   # PHASE:override goes to that phase only
#   ./multirun.sh profile:experiment.concurrency=1,4  # ... and replaces the phase's own sweep
#                                                   # of that key
#
# Environment: K25EXP_CAMPAIGN (default: campaign-<UTC time>), MLFLOW_TRACKING_URI (default:
# outputs/mlflow.db), PYTHON (default: .venv/bin/python if present, else python3).
# A phase that fails does not stop the others; the exit status says whether any failed.
# Each phase's multirun first ends the runs of jobs killed hard in the store (KILLED, with
# what their folders hold: k25exp.tracking.recover); single jobs never look.
set -uo pipefail
cd "$(dirname "$0")"

if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export K25EXP_CAMPAIGN="${K25EXP_CAMPAIGN:-campaign-$(date -u +%Y%m%dT%H%M%SZ)}"

# Phases and their sweeps come from the experiment schemas (campaign_order, campaign_sweep in
# k25exp/config/experiments/), with every dotted key each phase's config has (`server` and
# `server.port` only where the experiment drives a server, `experiment.input_tokens` only
# where its experiment has one): `python -m k25exp.config.campaign` lists them.
declare -A SWEEP=() HAS=() ANY=()
all_phases=()
while IFS=$'\t' read -r name keys args; do
  SWEEP[$name]="$args"; all_phases+=("$name")
  for k in $keys; do HAS["$name $k"]=1; ANY[$k]=1; done
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

# The dotted key an override sets (server.port=1 → server.port, +server.env.X=1 →
# server.env.X, server=endpoint → server, ~server.extra_args → server.extra_args); empty for
# Hydra's flags and its own hydra.* settings, which every phase takes.
override_key() {
  local a="$1" k
  [[ "$a" == -* || ( "$a" != *=* && "$a" != "~"* ) ]] && return
  k="${a#"${a%%[!+~]*}"}"; k="${k%%=*}"; k="${k%%@*}"; k="${k//\//.}"
  [[ "$k" == hydra || "$k" == hydra.* ]] || printf '%s' "$k"
}

# What an argument is scoped by: the longest start of its key that some phase's config has
# (experiment.input_tokens itself; server for +server.x, which no config has yet); empty for
# a key no phase has, which every phase gets, so that Hydra names the typo.
scope_key() {
  local k="$1"
  while [[ -n "$k" && -z "${ANY[$k]+set}" ]]; do
    if [[ "$k" == *.* ]]; then k="${k%.*}"; else k=""; fi
  done
  printf '%s' "$k"
}

# The first part of a scope key a phase's config lacks (server for server.port on gemm,
# experiment.input_tokens on nccl_burst, which has an experiment); empty if it has it all.
lacking() {
  local phase="$1" k="$2" p="" part parts
  IFS=. read -ra parts <<< "$k"
  for part in "${parts[@]}"; do
    p="${p:+$p.}$part"
    [[ -n "${HAS["$phase $p"]+set}" ]] || { printf '%s' "$p"; return; }
  done
}

# Each argument for every phase with its scope key (the same for every phase)
scopes=()
for a in ${common[@]+"${common[@]}"}; do
  k=$(override_key "$a"); scopes+=("${k:+$(scope_key "$k")}")
done

declare -A not_given=()  # per phase: the arguments it was not given, by the key it lacks
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
  # An argument for every phase goes to those whose config has its key: server.* reaches the
  # phases that drive a server, not nccl_burst or gemm (whose config has no server: Hydra would
  # refuse it), experiment.input_tokens the phases whose experiment has it. One line per key a
  # phase lacks says what it was not given.
  mine=() dropped=() lacks=() not_given=()
  for i in ${common[@]+"${!common[@]}"}; do
    a=${common[$i]}
    miss=""; [[ -n "${scopes[$i]}" ]] && miss=$(lacking "$phase" "${scopes[$i]}")
    if [[ -n "$miss" ]]; then
      dropped+=("$a")
      [[ -n "${not_given[$miss]+set}" ]] || lacks+=("$miss")
      not_given[$miss]+=" $a"
    else
      mine+=("$a")
    fi
  done
  for miss in ${lacks[@]+"${lacks[@]}"}; do
    echo "multirun.sh: phase $phase has no $miss in its config: not passing${not_given[$miss]}"
  done
  if (( ${#dropped[@]} )); then
    # One routing across the campaign: a served phase on dummy weights routes uniformly unless
    # model.routing says otherwise (k25exp.model.routing.effective); a phase without a server
    # can't see server.load_format, so it is told (the GEMM phase's MoE draws the same routing)
    if [[ " ${dropped[*]} " == *" server.load_format=dummy "* && " ${common[*]}" != *" model.routing="* ]]; then
      echo "multirun.sh: phase $phase: model.routing=uniform, as the served phases route on dummy weights"
      mine+=(model.routing=uniform)
    fi
  fi
  set -- ${mine[@]+"${mine[@]}"} ${extra[@]+"${extra[@]}"}  # (bash < 4.4: empty arrays and set -u)
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
