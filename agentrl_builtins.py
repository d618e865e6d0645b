"""agentrl's built-in plugin: registers what ships in this checkout (``agentrl.plugins``).

Importing it registers the built-in envs (``envs``), AgentLoops (``agents``), tools
(``tools``), sandbox backends (``sandboxes``) and the training commands (``trainers``); each
registration is a lazy ``module:attr`` string, so nothing heavy is imported here. The kernel
(``agentrl/``) finds this module through the ``agentrl.plugins`` entry point, or by name on the
path, and never names the implementation packages itself.
"""

import agents  # noqa: F401  (registers single_turn, tool_calling, env_driver)
import envs  # noqa: F401  (registers the built-in env ids)
import sandboxes  # noqa: F401  (registers local, docker, remote)
import tools  # noqa: F401  (registers bash, python, str_replace_editor, search, submit)
from agentrl.plugins import register_command

register_command("train", "trainers.cli:train_cmd")
register_command("sft", "trainers.cli:sft_cmd")
register_command("eval", "trainers.cli:eval_cmd")
register_command("swe", "envs.swe.cli:swe_app")
