"""Read a device tensor on the host later, without stopping the GPU's queue now.

    copy = HostCopy(loss.detach())   # queues a copy into pinned memory, records an event
    ...                              # queue more work: backward, the optimizer step
    value = copy.get()               # waits for that copy only, not for the work queued after

``float(tensor)`` on a CUDA tensor waits until the GPU has finished everything queued so far,
so the GPU idles while the host then starts queueing the next work. Copying the value out
first and reading it after the next work is queued keeps the GPU busy across the read.
On a CPU tensor the copy is immediate.
"""

from __future__ import annotations

import torch


class HostCopy:
    """A host copy of ``tensor`` as it is when this object is made; ``get`` waits for it."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self._event: torch.cuda.Event | None = None
        if tensor.is_cuda:
            self._host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            self._host.copy_(tensor, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._host = tensor.detach().clone()

    def get(self) -> torch.Tensor:
        if self._event is not None:
            self._event.synchronize()
            self._event = None
        return self._host
