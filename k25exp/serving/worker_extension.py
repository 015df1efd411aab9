"""What k25exp adds to vLLM's workers (`--worker-extension-cls`; vLLM takes one class): the
collective probe (the step's collectives timed in the TP workers) and the synthetic-acceptance
setter (speculative acceptance changed between levels). Each method is reached through vLLM's
`/collective_rpc` dev endpoint; a method the caller does not call costs nothing."""

from __future__ import annotations

from k25exp.serving.collective_probe import CollectiveProbe
from k25exp.serving.spec_acceptance import SyntheticAcceptance


class K25Worker(CollectiveProbe, SyntheticAcceptance):
    """Mixed into vLLM's worker class: `self` is the worker."""


EXTENSION = f"{__name__}.K25Worker"
