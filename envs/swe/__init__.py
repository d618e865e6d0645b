"""SWE tasks: repositories, tasks made from them, an env that runs them, honest grading.

    task      SWE-bench rows: SWETask, load_tasks, save_tasks
    repos     the pinned source distributions ``agentrl swe prepare`` fetches
    pyenv     the Python a repository's tests run with (offline venv + pytest)
    coverage  which tests call which functions (a call tracer, one run per repo)
    mutate    single-edit bugs found with ``ast`` and spliced into the source
    synth     ``agentrl swe synth``: mutants kept when some covering tests catch them
    validate  ``agentrl swe validate``: base fails, gold passes, graded in sandboxes
    grade     grade(task, patch, RepoEnv): a fresh sandbox, hidden tests, per-test outcomes
    env       swe/Repo-v0: a task in a sandbox, tools or bash mode, graded on submit
    cli       the ``agentrl swe`` command group

Path of a task: row -> prepared repo (once per repo, shared read-only) -> the task's scrubbed
workspace (once per task) -> a sandbox per trajectory -> an agent -> ``git diff`` -> ``grade``.
Importing ``envs.swe`` imports none of its modules. Guide: docs/guides/swe.md.
"""
