"""One local Ray instance (2 CPUs) shared by every test in tests/distributed.

The Worker classes live in ``distributed_workers.py``; Ray worker processes cannot import
test modules, so that module is pickled by value.
"""

from collections.abc import Iterator

import distributed_workers
import pytest


@pytest.fixture(scope="session")
def ray_local() -> Iterator[None]:
    import ray
    import ray.cloudpickle

    from agentrl.distributed import init_ray_local

    started = not ray.is_initialized()
    init_ray_local(num_cpus=2)
    ray.cloudpickle.register_pickle_by_value(distributed_workers)
    yield
    if started:
        ray.shutdown()
