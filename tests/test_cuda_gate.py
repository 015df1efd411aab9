"""When CUDA tests skip and when they fail (tests/conftest.py): skipped only on a machine
with no GPU at all; on one with a GPU whose torch cannot use it, they fail with the reason."""

from __future__ import annotations

from tests.conftest import cuda_state


def _torch(available=True, error=None):
    def probe():
        if error:
            raise error
        return available
    return probe


def test_no_gpu_at_all_skips_whatever_torch_says():
    for probe in (_torch(False), _torch(error=ImportError("no torch"))):
        state, why = cuda_state(devices=[], nvidia_smi=None, cuda_available=probe)
        assert state == "absent" and "no /dev/nvidia* device and no nvidia-smi" in why


def test_a_gpu_torch_cannot_use_is_a_failure_with_the_reason():
    state, why = cuda_state(devices=["/dev/nvidia0"], nvidia_smi=None,
                            cuda_available=_torch(error=RuntimeError("CUDA driver too old")))
    assert state == "broken" and "CUDA driver too old" in why and "/dev/nvidia0" in why
    state, why = cuda_state(devices=[], nvidia_smi="/usr/bin/nvidia-smi",
                            cuda_available=_torch(False))
    assert state == "broken" and "torch.cuda.is_available() is False" in why
    assert "/usr/bin/nvidia-smi" in why


def test_a_gpu_torch_can_use_runs_the_tests():
    assert cuda_state(devices=["/dev/nvidia0"], nvidia_smi="/usr/bin/nvidia-smi",
                      cuda_available=_torch(True))[0] == "ok"
