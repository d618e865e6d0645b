"""Sandbox backends: ``local`` (bubblewrap + cgroups) and ``docker``.

Backends register in ``agentrl.sandbox.SANDBOXES`` by a lazy import string; create one with
``agentrl.sandbox.make_sandbox(kind, **config)``.
"""
