"""Which collective a device kernel runs: from the kernel's own "Collective name", else from
what launched it (the runtime launch sharing its `correlation` id and the host operators
around that launch), and from its name only when nothing better exists. Expected figures
are counted by hand from the events below."""

from __future__ import annotations

import pytest

from k25exp.traces import analyze
from k25exp.traces.breakdown import IDLE
from tests.traces.builders import DECODE, ev, op, step, write_trace

# NCCL runs all-to-all, all-reduce and all-gather alike as SendRecv kernels on some setups
# (a 128-rank DLRM job: all of rank 0's NCCL kernels had this name).
SR = "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t"
SR_DEV = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
COPY = ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl<"
        "at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)> >(int)")


def _kernel(i: int, name: str, corr: int | None, **args) -> dict:
    """Kernel i on stream 20: [20 + 60 i, +10) µs."""
    a = dict(args)
    if corr is not None:
        a["correlation"] = corr
    return ev(name, 20 + 60 * i, 10, tid=20, args=a)


def _launch(i: int, corr: int, around: list[tuple[str, dict | None]],
            api: tuple[str, str] = ("cudaLaunchKernel", "cuda_runtime")) -> list[dict]:
    """The host launch of kernel i at [5 + 60 i, +2) µs on thread 100, inside the operators
    `around` (outermost first), each 1 µs wider on both sides than the one it holds."""
    t = 5 + 60 * i
    k = len(around)
    out = [op(name, t - (k - j), 2 + 2 * (k - j), args=args) for j, (name, args) in enumerate(around)]
    out.append(ev(api[0], t, 2, cat=api[1], pid=100, tid=100, args={"correlation": corr}))
    return out


def _events() -> list[dict]:
    events = [step(DECODE, 0, 1000, device=True, ext=1)]   # one decode step, 1000 µs
    for i in range(4):        # kernels 0-3: launched by nccl:all_to_all
        events += [_kernel(i, SR, i + 1)] + _launch(i, i + 1, [("nccl:all_to_all", None)])
    for i in range(4, 8):     # 4-7: nccl:all_reduce, inside c10d's op
        events += [_kernel(i, SR, i + 1)] + _launch(
            i, i + 1, [("c10d::allreduce_", None), ("nccl:all_reduce", None)])
    for i in (8, 9):          # 8-9: nccl:_all_gather_base, launched through the driver API
        events += [_kernel(i, SR, i + 1)] + _launch(
            i, i + 1, [("nccl:_all_gather_base", None)], api=("cuLaunchKernelEx", "cuda_driver"))
    # 10: the kernel names its collective itself; no launch recorded
    events.append(_kernel(10, SR_DEV, 11, **{"Collective name": "allreduce"}))
    # 11: record_param_comms names it, inside an operator that says nothing
    events += [_kernel(11, SR, 12)] + _launch(
        11, 12, [("MyModel.forward", None), ("record_param_comms", {"Collective name": "_allgather_base"})])
    # 12: no launch with its correlation id, no argument: by its name (SendRecv)
    events.append(_kernel(12, SR, 99))
    # 13: a copy launched inside nccl:all_reduce is still a copy
    events += [_kernel(13, COPY, 14)] + _launch(13, 14, [("nccl:all_reduce", None)])
    return events


def test_collective_kernels_by_what_launched_them(tmp_path):
    a = analyze([write_trace(tmp_path / "rank0.json", _events())])
    r = a.ranks[0]
    assert r.mode == "gpu" and r.steps_analysed == 1 and r.decode_step_ms == pytest.approx(1.0)
    # by hand, of 1000 µs: all-reduce kernels 4-7 and 10 (5 x 10 µs), all-to-all 0-3 and 12,
    # all-gather 8, 9, 11, the copy 13; idle the other 860 µs
    sh = r.shares()
    assert sh["comm_allreduce"] == pytest.approx(5.0)
    assert sh["comm_all_to_all"] == pytest.approx(5.0)
    assert sh["comm_allgather"] == pytest.approx(3.0)
    assert sh["memory"] == pytest.approx(1.0)
    assert sh[IDLE] == pytest.approx(86.0)
    assert sum(v for k, v in sh.items() if k not in
               ("comm_allreduce", "comm_all_to_all", "comm_allgather", "memory", IDLE)) == 0
    # one kernel name, three collectives: a row each in the top kernels
    rows = {(k.name, k.category): k.calls for k in r.kernels}
    assert rows == {(SR, "comm_all_to_all"): 5, (SR, "comm_allreduce"): 4,
                    (SR, "comm_allgather"): 3, (SR_DEV, "comm_allreduce"): 1,
                    (COPY, "memory"): 1}
    # how each of the 13 collective kernels was attributed
    assert a.to_dict()["ranks"][0]["collectives"] == {"kernel_arg": 1, "launcher": 11, "name": 1}


def test_collective_names_have_a_communication_category():
    # torch's "Collective name" values (record_param_comms, kernel args), classified with
    # the event category "collective": every one is communication, whatever its name
    from k25exp.traces import load_rules

    expected = {
        "allreduce": "comm_allreduce", "all_to_allv": "comm_all_to_all",
        "alltoall_base": "comm_all_to_all", "_allgather_base": "comm_allgather",
        "allgather_into_tensor_coalesced": "comm_allgather",
        "reduce_scatter_tensor_coalesced": "comm_other", "broadcast": "comm_other",
        "send": "comm_other", "recv": "comm_other", "barrier": "comm_other"}
    rules = load_rules()
    assert {n: rules.classify(n, "collective") for n in expected} == expected
