"""agentrl: environment-centric reinforcement learning for LLM agents.

Importing ``agentrl`` is cheap and has no side effects; heavy parts (torch, ray, the server)
load when used.
"""

from agentrl.errors import AgentRLError, ConfigError
from agentrl.types import (
    Message,
    RolloutStatus,
    Sample,
    Segment,
    ToolCall,
    Trajectory,
    TrajectoryGroup,
    Turn,
)

__version__ = "0.1.0"

__all__ = [
    "AgentRLError",
    "ConfigError",
    "Message",
    "RolloutStatus",
    "Sample",
    "Segment",
    "ToolCall",
    "Trajectory",
    "TrajectoryGroup",
    "Turn",
    "__version__",
]
