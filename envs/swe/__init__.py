"""SWE tasks: repository rows (``task``), honest grading in fresh sandboxes (``grade``), and
the Python environment a repository's tests run in (``pyenv``).

The path this package grows into (issue 21): task row -> prepared repo (once per repo, shared
read-only) -> a copy-on-write workspace per trajectory -> an agent -> ``git diff`` -> ``grade``.
Importing ``envs.swe`` imports none of its modules.
"""
