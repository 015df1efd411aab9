"""GPU telemetry while a job measures: NVML sampled by a thread at a fixed period, and the
two verdicts a figure's reader needs (was the GPU throttled, was it shared).

Pure Python plus nvidia-ml-py (``pynvml``) when importable: no torch, Hydra or MLflow, so
it runs and is tested anywhere. MLflow logging sits at the edge (k25exp.tracking.telemetry).
  procs         whose a GPU process is: this job's tree, or the served engine's (the
                process listening on an endpoint's port, and its children), from /proc
  nvml_sampler  the sampler thread and what it read
  summary       throttle and shared-GPU verdicts, summary figures, time series, CSV rows
"""
