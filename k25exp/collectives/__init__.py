"""Collective benchmarks: the torchrun worker, its launcher, and result aggregation.

The worker (``k25exp.collectives.worker``) imports torch alone, so it runs on GPU nodes that
have no Hydra or MLflow installed.
"""
