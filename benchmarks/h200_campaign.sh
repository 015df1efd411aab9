#!/usr/bin/env bash
# The campaign on one lent H200 with vLLM's CUDA build, stage by stage, as each device call
# runs one (a call may last 10 minutes; run them back to back so /tmp survives between them).
# Run from the project root on the GPU machine after ../shared/gpu's unpack.sh and env.sh:
#
#   benchmarks/h200_campaign.sh kimi-macro     # one TP-8 rank of Kimi-K2.5 INT4, dummy weights
#   benchmarks/h200_campaign.sh kimi-open      # the same rank, open loop 8/32/64 req/s
#   benchmarks/h200_campaign.sh kimi-rest      # its profile (c = 1, 32, 128, 256), the GEMM phase
#   benchmarks/h200_campaign.sh kimi-profile   # kimi-rest's profile alone, and then
#   benchmarks/h200_campaign.sh kimi-gemm      # its GEMM phase alone (two calls, each well
#                                              # inside a call's 10 minutes)
#   benchmarks/h200_campaign.sh kimi-spec      # n-gram speculative decoding on the rank, k = 3,
#                                              # against its own baseline (one job, two starts)
#   benchmarks/h200_campaign.sh kimi-spec-synth  # a drafter (K25_SPEC, default ngram; K25_SPEC_K,
#                                              # or K25_SPEC_DRAFTS='[1,3,5]' in one job)
#                                              # at synthetic α 0.5/0.7/0.9 × c 1/4/16/64 against
#                                              # the baseline (and, for ngram, without async
#                                              # scheduling); campaign <K25_TAG>-kimi-spec
#   benchmarks/h200_campaign.sh kimi-spec-prof-base  # the speculative step profiled (campaign
#   benchmarks/h200_campaign.sh kimi-spec-prof-spec  # <K25_TAG>-kimi-spec): the baseline's profile,
#   benchmarks/h200_campaign.sh kimi-spec-prof-sync  # the n-gram server's at each α and level
#                                              # (one start), the baseline without async
#                                              # scheduling; K25_SPEC (spec=), K25_SPEC_LEVELS,
#                                              # K25_SPEC_ALPHAS
#   benchmarks/h200_campaign.sh kimi-context   # closed loop at 1k/8k/32k prompts x c 1/4/16, one start
#   benchmarks/h200_campaign.sh kimi-context-prof  # the profile at those contexts (c 1, 16)
#   benchmarks/h200_campaign.sh kimi-context-gemm  # the GEMM phase at c 1/4/16 (campaign <K25_TAG>-kimi-context)
#   benchmarks/h200_campaign.sh kimi-load      # lognormal prompts, sessions, a replayed trace
#   benchmarks/h200_campaign.sh kimi-skewed    # hot experts: macro c = 32, 128 and the MoE micro
#   benchmarks/h200_campaign.sh kimi-bench     # k25exp's client beside vLLM's bench serve, 3 × each
#   benchmarks/h200_campaign.sh tiny           # tiny_kimi: macro, profile, spec_decode (ngram)
#   benchmarks/h200_campaign.sh cuda-tests [PYTEST ARGS]   # pytest -m cuda (default: the CUDA suites)
#
# The Kimi rank is served with uniform routing (model.routing=uniform: vLLM's routing simulator;
# dummy weights make an untrained router that sends a batch to a few experts), and its MoE
# micro-benchmark draws the same expert ids.
#
# Every stage ends by packing the offline runs made so far (traces left out) into
# $OUT/runs-<stage>.tar.gz, and the traces this stage wrote into 15 MiB parts beside it (six
# at most; a Kimi rank's profile window was 2.7-3.0 MB on the H100); here:
#   tar -xzf runs-<stage>.tar.gz -C outputs/gpu && k25exp sync outputs/gpu/...
#   cat traces-<stage>.tar.part.* | tar -x -C outputs/gpu   # k25exp analyze TRACE --tail RUN_FOLDER
set -euo pipefail
cd "$(dirname "$0")/.."
stage=${1:?usage: h200_campaign.sh kimi-macro|kimi-open|kimi-rest|kimi-profile|kimi-gemm|kimi-spec|kimi-spec-synth|kimi-spec-prof-base|kimi-spec-prof-spec|kimi-spec-prof-sync|kimi-skewed|kimi-bench|tiny|cuda-tests}
out=${K25_GPU_OUT:-/tmp/k25out}   # /tmp survives between calls on a warm machine; the tree does not
campaign=${K25_GPU_CAMPAIGN:-${K25_TAG:-h200}-kimi-rank}   # the uniform-routing rank's campaign id
export PYTHON=${PYTHON:-python3}
# K25_HW / K25_LAYERS: another one-GPU kind (K25_HW=h100_x1 K25_LAYERS=31: the rank of one
# stage of TP-8 x PP-2, which fits an H100's 80 GB; its campaign ids start with K25_TAG)
hw=${K25_HW:-h200_x1}
tag=${K25_TAG:-h200}
common=(hardware=$hw tracking=offline "paths.outputs=$out" "server.model_cache=$out/models"
        server.enforce_eager=false server.port=0 "server.kv_cache_memory_gib=${K25_KV_GIB:-16}")
kimi=(model=kimi_k25_int4 model.tp_rank_of=8 server.load_format=dummy model.routing=uniform)
[[ -n ${K25_LAYERS:-} ]] && kimi+=("model.num_hidden_layers=$K25_LAYERS")

# K25_STAGE_S: stop the stage's job after this many seconds (SIGINT: the servers are stopped and
# what was measured is kept), so a call that runs long still packs its runs before its limit
limit=(); [[ -n ${K25_STAGE_S:-} ]] && limit=(timeout -s INT -k 30 "$K25_STAGE_S")
mkdir -p "$out" && touch "$out/.stage-start"   # the traces this stage writes are newer
case $stage in
  kimi-macro)
    # closed loop c = 1 … 256, one server start (a cold Kimi rank takes ~6 min of the call);
    # c = 2 and 4 are the verification steps of draft lengths 1 and 3 (the report's
    # speculative projection prices k drafted tokens at the TPOT of c = k + 1)
    K25EXP_CAMPAIGN=$campaign PHASES=macro ./multirun.sh "${common[@]}" "${kimi[@]}" \
      'macro:experiment.concurrency=[1,2,4,8,32,128,256]' macro:experiment.load=closed || true ;;
  kimi-open)
    # open loop, one rate sweep (not part of the budget: it predicts closed-loop levels)
    K25EXP_CAMPAIGN=$campaign PHASES=macro ./multirun.sh "${common[@]}" "${kimi[@]}" \
      macro:experiment.load=open 'macro:experiment.request_rate=[8,32,64]' || true ;;
  kimi-rest|kimi-profile|kimi-gemm)
    # the GEMM sweep reaches the highest macro concurrency (M and MoE tokens to 256); each
    # figure isolated (eager, L2 flushed) and in-stream (one CUDA graph, rotating copies)
    # (the profile reaches c = 256 too: a level without one holds its uncovered time at the
    # nearest profiled level, which read 19 % low at 256)
    phases="profile gemm"
    [[ $stage == kimi-profile ]] && phases=profile
    [[ $stage == kimi-gemm ]] && phases=gemm
    K25EXP_CAMPAIGN=$campaign PHASES="$phases" ./multirun.sh "${common[@]}" "${kimi[@]}" \
      "profile:experiment.concurrency=${K25_PROFILE_LEVELS:-1,32,128,256}" gemm:experiment.calls=50 \
      'gemm:experiment.kernels=[torch_bf16,vllm_linear,marlin]' \
      'gemm:experiment.moe_kernels=[vllm_marlin_moe]' \
      'gemm:experiment.m_values=[1,2,4,8,16,32,64,128,256]' \
      'gemm:experiment.moe_batches=[1,8,32,128,256]' || true ;;
  kimi-spec)
    # vLLM's n-gram drafter (k = 3) on the rank, then the same server without it (a start the
    # macro's compile cache serves). On dummy weights the acceptance is whatever the untrained
    # model's repetitions give: the report sets the measured speedup against its projection at
    # the run's own α_eff, so the figure checks the step cost, not a trained model's acceptance
    K25EXP_CAMPAIGN=$campaign PHASES=spec_decode ./multirun.sh "${common[@]}" "${kimi[@]}" \
      spec_decode:spec=ngram 'spec_decode:experiment.concurrency=[1,8,32]' || true ;;
  kimi-spec-synth)
    # acceptance as configuration on the rank: n-gram drafts (k = 3) accepted at α = 0.5, 0.7,
    # 0.9 by vLLM's synthetic rejection sampling (α set in the workers between measurements: one
    # spec start), against the baseline with and without async scheduling. One round per call
    # (three starts of the rank fit in a call's 10 minutes, six do not): run the stage again for
    # more rounds; the report pools the runs of one setting
    # K25_SPEC picks the drafter (ngram_gpu and eagle3 keep async scheduling, so they need no
    # baseline without it), K25_SPEC_K its draft length
    spec=${K25_SPEC:-ngram}
    sync=true; [[ $spec == ngram ]] || sync=false
    # K25_SPEC_DRAFTS='[1,3,5]': every k in one job, each its own server beside one baseline
    # start (experiment.draft_lengths; K25_SPEC_K, default 3, must be among them)
    drafts=(); [[ -n ${K25_SPEC_DRAFTS:-} ]] && drafts=("spec_decode:experiment.draft_lengths=$K25_SPEC_DRAFTS")
    K25EXP_CAMPAIGN=${K25_GPU_CAMPAIGN:-$tag-kimi-spec} PHASES=spec_decode "${limit[@]}" ./multirun.sh \
      "${common[@]}" "${kimi[@]}" \
      "spec_decode:spec=$spec" spec_decode:experiment.acceptance=synthetic \
      "spec_decode:experiment.num_speculative_tokens=${K25_SPEC_K:-3}" "${drafts[@]}" \
      "spec_decode:experiment.baseline_sync=$sync" \
      "spec_decode:experiment.alphas=${K25_SPEC_ALPHAS_LIST:-[0.5,0.7,0.9]}" \
      "spec_decode:experiment.concurrency=${K25_SPEC_LEVELS:-[1,4,16,64]}" \
      spec_decode:server.max_num_seqs=64 || true ;;
  kimi-spec-prof-base|kimi-spec-prof-sync)
    # the baselines of the speculative profile, one server start each: as vLLM schedules
    # (async), and without async scheduling (the n-gram drafter's scheduling); a campaign of
    # their own, so the budget's profile never meets a --no-async-scheduling one
    sync=()
    [[ $stage == kimi-spec-prof-sync ]] && sync=('server.extra_args=[--disable-uvicorn-access-log,--no-async-scheduling]')
    K25EXP_CAMPAIGN=$tag-kimi-spec PHASES=profile ./multirun.sh "${common[@]}" "${kimi[@]}" \
      server.max_num_seqs=64 "${sync[@]}" \
      "profile:experiment.concurrency=${K25_SPEC_LEVELS:-1,4,16,64}" || true ;;
  kimi-spec-prof-spec)
    # the n-gram server profiled at each α × level on one start (α set in its workers):
    # each cycle split into verification, rejection sampler, drafter, host gap
    # (K25_SPEC_BASELINES='[baseline]': the baseline captured in the same job, after the spec
    # server, for a drafter that keeps async scheduling; the default leaves them to the stages
    # above)
    # K25_SPEC=ngram_gpu: vLLM 0.26 turns its torch.compile cache off for that drafter, so
    # each of its starts compiles anew (the 31-layer rank's profiled start took 474.5 s on a
    # fresh H100): give its capture a call of its own, and its baseline the next
    K25EXP_CAMPAIGN=$tag-kimi-spec "${limit[@]}" $PYTHON -m k25exp -m experiment=spec_profile "spec=${K25_SPEC:-ngram}" \
      "${common[@]}" "${kimi[@]}" server.max_num_seqs=64 \
      "experiment.baselines=${K25_SPEC_BASELINES:-[]}" \
      "experiment.num_speculative_tokens=${K25_SPEC_K:-3}" \
      "experiment.alphas=${K25_SPEC_ALPHAS:-[0.5],[0.7],[0.9]}" \
      "experiment.concurrency=${K25_SPEC_LEVELS:-1,4}" || true ;;
  kimi-context)
    # context as a sweep axis: the closed loop at each prompt length on one server start (the
    # jobs of one multirun share it: its settings do not change), the KV cache sized for
    # c = 16 at 32 k tokens (K25_KV_GIB=40: ~610 k tokens of the rank's MLA cache)
    K25EXP_CAMPAIGN=$tag-kimi-context "${limit[@]}" $PYTHON -m k25exp -m experiment=macro \
      "${common[@]}" "${kimi[@]}" server.max_model_len=33024 experiment.load=closed \
      "experiment.concurrency=${K25_CONTEXT_LEVELS:-[1,4,16]}" \
      "experiment.input_tokens=${K25_CONTEXTS:-1024,8192,32768}" || true ;;
  kimi-context-prof|kimi-context-gemm)
    # the profile at the same contexts (one start: the prompt length is the client's), so the
    # report's context budget fits attention and KV reads over profiled (context, c) points;
    # then the campaign's GEMM phase (micro-benchmarks at c, whatever the context)
    phases=profile; [[ $stage == kimi-context-gemm ]] && phases=gemm
    K25EXP_CAMPAIGN=$tag-kimi-context PHASES=$phases "${limit[@]}" ./multirun.sh \
      "${common[@]}" "${kimi[@]}" \
      server.max_model_len=33024 \
      "profile:experiment.concurrency=${K25_CONTEXT_PROF_LEVELS:-1,16}" \
      "profile:experiment.input_tokens=${K25_CONTEXTS:-1024,8192,32768}" gemm:experiment.calls=50 \
      'gemm:experiment.kernels=[torch_bf16,vllm_linear,marlin]' \
      'gemm:experiment.moe_kernels=[vllm_marlin_moe]' 'gemm:experiment.m_values=[1,4,16]' \
      'gemm:experiment.moe_batches=[1,4,16]' || true ;;
  kimi-load)
    # the load users send, on one server start: lognormal prompt lengths, multi-turn sessions,
    # a generated Mooncake-form trace replayed at its own times (one multirun, one start)
    $PYTHON -m k25exp.load.trace_gen "$out/trace.jsonl" --requests 96 --rate 8 \
      --input 600:6000 --output 16:128 --seed 0
    K25EXP_CAMPAIGN=$tag-kimi-load $PYTHON -m k25exp -m experiment=macro "${common[@]}" "${kimi[@]}" \
      server.max_model_len=8448 experiment.load=closed,sessions \
      "experiment.concurrency=${K25_LOAD_LEVELS:-[1,16,64]}" \
      experiment.input_tokens=1024 experiment.input_len.dist=lognormal \
      experiment.input_len.sigma=0.5 experiment.input_len.max=2048 || true
    K25EXP_CAMPAIGN=$tag-kimi-load $PYTHON -m k25exp experiment=macro "${common[@]}" "${kimi[@]}" \
      server.max_model_len=8448 experiment.load=trace "experiment.trace.path=$out/trace.jsonl" \
      || true ;;
  kimi-skewed)
    # a campaign of its own: its figures never meet the uniform ones in one sum
    K25EXP_CAMPAIGN=$tag-kimi-skewed PHASES="macro gemm" ./multirun.sh "${common[@]}" "${kimi[@]}" \
      model.routing=skewed 'macro:experiment.concurrency=[32,128]' macro:experiment.load=closed \
      'gemm:experiment.shapes=[router]' 'gemm:experiment.kernels=[torch_bf16]' \
      'gemm:experiment.m_values=[1]' 'gemm:experiment.moe_kernels=[vllm_marlin_moe]' \
      'gemm:experiment.moe_batches=[32,128]' gemm:experiment.calls=50 || true ;;
  kimi-bench)
    # one server (as k25exp launches it), both clients alternating, 3 runs each per level
    $PYTHON benchmarks/with_server.py "${common[@]}" "${kimi[@]}" -- \
      $PYTHON -m benchmarks.client_vs_vllm_bench --base-url {base_url} --model {model} \
      --tokenizer {model_path} hardware=$hw --out "$out/bench" || true ;;
  tiny)
    K25EXP_CAMPAIGN=$tag-tiny PHASES="macro profile spec_decode" ./multirun.sh "${common[@]}" \
      'macro:experiment.concurrency=[1,8,32,128]' spec_decode:spec=ngram || true ;;
  cuda-tests)
    shift
    (($#)) || set -- tests/gemm tests/collectives tests/serving/test_cuda_serving.py
    $PYTHON -m pytest -o addopts="" -ra -p no:cacheprovider -m cuda "$@" 2>&1 | tail -40 || true ;;
  *) echo "h200_campaign.sh: unknown stage $stage" >&2; exit 2 ;;
esac
if [[ -n "${OUT:-}" && -d $out ]]; then
  (cd "$out" && find . -path ./models -prune -o -name '*.pt.trace.json*' -prune -o -type f -print \
     | tar -czf "$OUT/runs-$stage.tar.gz" -T -)
  # this stage's traces (already gzipped) beside them, in 15 MiB parts (a call returns 8 files
  # of 16 MiB at most): a Kimi rank's profile window is 3-50 MB, and the traces are what a newer
  # analysis re-reads (k25exp analyze TRACE --tail RUN_FOLDER). Parts beyond 6 stay here.
  #   here: cat traces-<stage>.tar.part.* | tar -x -C outputs/gpu
  traces=$(cd "$out" && find . -path ./models -prune -o -path ./profiles -prune -o \
             -newer .stage-start -name '*.pt.trace.json*' -type f -print)
  if [[ -n $traces ]]; then
    (cd "$out" && tar -cf - $traces | split -b 15m -a 1 - "$OUT/traces-$stage.tar.part.")
    find "$OUT" -name "traces-$stage.tar.part.*" | sort | tail -n +7 | xargs -r rm -f
  fi
  ls -la "$OUT"
fi
