"""The platform attngate's own backends run on: the GPU torch sees, kept here so that the core never imports torch."""

from __future__ import annotations

import torch


def attngate_platform():
    """The deployment of attngate's own backends (AttngateRuntime, the plain transformers path): this host's GPU and
    kernels where CUDA is visible, else an H100 with the ``attngate[gpu]`` kernels (the backends then run the reference
    on the CPU); ``runs_sglang`` False, so rules about SGLang's backend code do not refuse what attngate runs."""
    from attngate.facts.platform import Platform

    if torch.cuda.is_available():
        return Platform.detect().model_copy(update={"runs_sglang": False})
    return Platform.from_name("sm90", kernels=["attngate"], runs_sglang=False)
