"""Sandbox backends: ``local`` (bubblewrap + cgroups), ``docker`` and ``remote`` (a sandbox server).

Backends register in ``agentrl.sandbox.SANDBOXES`` by a lazy import string (importing this
package imports no backend); create one with ``agentrl.sandbox.make_sandbox(kind, **config)``.
"""

from agentrl.sandbox import SANDBOXES

SANDBOXES.register("local", "sandboxes.local:LocalSandbox", description="bubblewrap + cgroups")
SANDBOXES.register("docker", "sandboxes.docker:DockerSandbox", description="Docker containers")
SANDBOXES.register(
    "remote", "sandboxes.remote:RemoteSandbox", description="a sandbox server, over HTTP"
)
