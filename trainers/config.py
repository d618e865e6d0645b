"""The typed config of a training run; a recipe YAML mirrors these dataclasses.

    cfg = load_run_config("recipes/quickstart.yaml", ["train.steps=10", "rollout.group_size=8"])

RunConfig
├── model       an HF directory, or a tiny model built locally from a spec
├── data        which envs, and the seeds of the samples drawn from them (the data cursor)
├── rollout     the RolloutCollector: group size, agent, sampling, turn and token limits
├── reward      an optional rubric of reward functions (import strings) replacing the env's
├── algo        advantage estimator, policy loss, KL (+ controller), entropy, aggregation,
│               group filtering, rollout IS correction, overlong filter / penalty
├── train       steps, batch size (in groups), PPO epochs, mini-batches, ranks
├── engine      the policy's engine (optimizer, LR schedule, dtype, device, micro-batches)
├── critic      the critic's engine (adv_estimator=gae only)
├── inference   inference servers: backend (embedded, vLLM, SGLang), count, placement, sync
├── checkpoint  where / how often / how many
├── logging     console / JSONL / TensorBoard / Weights & Biases
├── trajectories  a sample of each step's trajectories for `agentrl view`, under a disk cap
├── sft         warm-up on env demonstrations before RL
└── eval        evaluation before / after / during training

``validate()`` checks the combinations a type cannot (batch vs group size, known registry
names) and raises ``ConfigError`` naming the key and a fix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.algos.advantages import AdvantageConfig
from agentrl.algos.losses import PolicyLossConfig
from agentrl.config import load_config
from agentrl.engine import EngineConfig
from agentrl.errors import ConfigError
from agentrl.inference.protocol import DEFAULT_MAX_BATCH_SIZE
from agentrl.inference.supervisor import ServerSupervisor
from agentrl.logging import MetricsLogger
from agentrl.registry import import_modules, load_entry_point
from agentrl.reward import Rubric
from agentrl.rollout.collector import CollectorConfig
from agentrl.splits import DEFAULT_EVAL_FRACTION
from agentrl.types import Sample
from trainers.checkpoint import CheckpointManager
from trainers.engines.megatron.config import MegatronConfig
from trainers.trajectory_log import TrajectoryLog


@dataclass(kw_only=True)
class TinyModelConfig:
    """A randomly initialised model built with agentrl.tiny.make_tiny_model."""

    arch: str = "qwen2"
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 0
    """0: 4 * hidden_size."""
    vocab_size: int = 1024
    seed: int | None = None
    """Seed of the random initialisation; None: the run's ``seed``."""
    corpus_demos: int = 0
    """Also train the tokenizer on the text of this many train-split oracle demonstrations
    (the envs' own pages and actions), so the task's words are tokens, as in a pretrained
    tokenizer, not single letters. 0: the built-in corpus only. Eval-split tasks never
    contribute."""


@dataclass(kw_only=True)
class ModelConfig:
    path: str = ""
    """An HF model directory. Empty: build the tiny model below into <run_dir>/base_model."""
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)


@dataclass(kw_only=True)
class EnvEntry:
    id: str
    """A registered env id, e.g. 'arith/Countdown-v0'."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Constructor arguments for the env."""


@dataclass(kw_only=True)
class DataConfig:
    """The samples: sample i uses env ``envs[i % len(envs)]`` and a seed from ``seed``.

    Train and eval samples come from content-disjoint splits of each env's tasks: a hash of the
    task's content (``Env.task_key``, by default the prompt) puts ``eval_fraction`` of all tasks
    in "eval" and the rest in "train" (``agentrl.splits``). SFT demonstrations and RL samples
    draw from "train", evaluation from "eval", so no eval task is ever trained on, whatever the
    seeds. The data cursor (how many samples were drawn) is all a checkpoint needs to continue
    the same sequence.
    """

    envs: list[EnvEntry] = field(default_factory=list)
    seed: int | None = None
    """Seed of sample 0; sample i of an env gets seed + i // len(envs) (mod num_seeds).
    None: derived from the run's ``seed`` (seed * 1_000_003), so runs with different seeds see
    different task orders."""
    num_seeds: int = 0
    """Distinct seeds per env; 0: a fresh seed for every sample (never repeats)."""
    eval_fraction: float = DEFAULT_EVAL_FRACTION
    """Share of each env's tasks (by content hash) in the eval split, in (0, 1)."""
    eval_seed: int = 1_000_000_000
    """Seed of the first eval sample. Eval samples do not depend on the run's seed, so runs
    with different seeds are evaluated on the same tasks."""

    def sample(self, index: int, *, eval: bool = False) -> Sample:
        """The ``index``-th sample of the (train or eval) stream; deterministic."""
        entry = self.envs[index % len(self.envs)]
        k = index // len(self.envs)
        if self.num_seeds and not eval:
            k %= self.num_seeds
        seed = (self.eval_seed if eval else (self.seed or 0)) + k
        split = "eval" if eval else "train"
        return Sample(
            env_id=entry.id,
            env_kwargs=dict(entry.kwargs),
            seed=seed,
            uid=f"{split}-{index}",
            split=split,
            eval_fraction=self.eval_fraction,
        )


@dataclass(kw_only=True)
class KLConfig:
    type: str = "k3"
    """KL estimator (a KL_PENALTIES name: k1, k2, k3, abs, ...)."""
    coef: float = 0.0
    """0 disables KL and the reference model. With controller=adaptive: the initial value."""
    in_reward: bool = False
    """True: subtract coef * KL from the token rewards (PPO style); False: add it to the loss."""
    controller: str = "fixed"
    """fixed | adaptive: after each step, move coef towards ``target`` KL (Ziegler et al.,
    ``agentrl.algos.AdaptiveKLController``); its value is saved in checkpoints."""
    target: float = 0.1
    """adaptive: the KL (token mean of ``type`` against the reference) to hold."""
    horizon: int = 10000
    """adaptive: sequences over which coef moves by at most a factor 1.2 (e^0.2)."""


@dataclass(kw_only=True)
class RolloutISConfig:
    """Truncated importance sampling between the trainer's and the servers' logprobs."""

    enabled: bool = False
    """Weight each token's policy loss by min(pi_old / mu, cap) (``agentrl.algos.correction``)."""
    level: str = "token"
    """token: one weight per token; sequence: the product of a sequence's token ratios."""
    cap: float = 2.0
    """Upper truncation of the weight."""


@dataclass(kw_only=True)
class OverlongConfig:
    """DAPO's overlong handling (``agentrl.algos.filters``)."""

    filter: bool = False
    """Mask rollouts that ran out of tokens (status truncated_length) out of the loss."""
    penalty: bool = False
    """Add the soft length penalty to the reward: 0 up to max_len - cache_len generated tokens,
    then a linear ramp down to -penalty_factor at max_len."""
    max_len: int = 0
    """penalty: generated tokens (all turns of a trajectory) that earn the full penalty."""
    cache_len: int = 0
    """penalty: width of the ramp, 0 < cache_len <= max_len."""
    penalty_factor: float = 1.0


@dataclass(kw_only=True)
class AlgoConfig:
    adv_estimator: str = "grpo"
    """An ADV_ESTIMATORS name: grpo, dr_grpo, rloo, reinforce_plus_plus, gae (needs the critic), ..."""
    adv: AdvantageConfig = field(default_factory=AdvantageConfig)
    policy_loss: str = "ppo_clip"
    """A POLICY_LOSSES name: ppo_clip, gspo, cispo, ..."""
    clip: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    loss_agg: str = "token-mean"
    """token-mean | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm."""
    entropy_coef: float = 0.0
    kl: KLConfig = field(default_factory=KLConfig)
    value_clip: float = 0.2
    """Clip range of the PPO critic's value loss."""
    filter_groups: bool = False
    """Drop groups whose rewards are all equal (no GRPO signal) and sample more (DAPO)."""
    max_filter_rounds: int = 4
    """With filter_groups: after this many rounds without enough groups with signal, groups with
    identical rewards fill the batch (zero advantage under GRPO) and a warning says so."""
    rollout_is: RolloutISConfig = field(default_factory=RolloutISConfig)
    overlong: OverlongConfig = field(default_factory=OverlongConfig)


@dataclass(kw_only=True)
class RubricEntry:
    fn: str
    """Import string of a reward function, 'package.module:function' (see agentrl.reward)."""
    weight: float = 1.0
    """0: computed and logged as a metric only."""
    name: str = ""
    """Component name in metrics; empty: the function's name."""


@dataclass(kw_only=True)
class RewardConfig:
    rubric: list[RubricEntry] = field(default_factory=list)
    """Reward functions whose weighted sum replaces the env's reward of every rollout (train,
    and the greedy baselines of remax); empty: the env's reward. Include
    ``agentrl.reward:env_reward`` to keep the env's reward as one term."""

    def build_rubric(self) -> Rubric | None:
        """The Rubric of ``rubric`` (None when empty); a bad entry raises ConfigError."""
        if not self.rubric:
            return None
        funcs = []
        for i, e in enumerate(self.rubric):
            key = f"reward.rubric[{i}]"
            mod, _, attr = e.fn.partition(":")
            if not (mod and attr):
                raise ConfigError(
                    f"{key}.fn must look like 'package.module:function', got {e.fn!r}; "
                    "e.g. agentrl.reward:env_reward"
                )
            import_modules([mod], key=f"{key}.fn")  # the current directory first, like `modules`
            try:
                fn = load_entry_point(e.fn)
            except AttributeError:
                raise ConfigError(f"{key}.fn={e.fn!r}: module {mod!r} has no {attr!r}") from None
            if not callable(fn):
                raise ConfigError(f"{key}.fn={e.fn!r} is a {type(fn).__name__}, not a function")
            if not math.isfinite(e.weight):
                raise ConfigError(f"{key}.weight must be a finite number, got {e.weight}")
            funcs.append((fn, e.weight, e.name) if e.name else (fn, e.weight))
        return Rubric(funcs)


@dataclass(kw_only=True)
class TrainConfig:
    steps: int = 10
    batch_size: int = 8
    """Groups per RL step (each holds rollout.group_size trajectories)."""
    ppo_epochs: int = 1
    mini_batch_size: int = 0
    """Groups per optimizer step; 0: the whole batch (one optimizer step per epoch)."""
    world_size: int = 1
    """Training ranks (data parallel) of each model role."""
    num_cpus: int = 0
    """CPUs Ray may use (0: all it detects)."""
    max_error_rate: float = 0.5
    """A step in which more than this fraction of the rollouts failed in the machinery (env,
    tool, sandbox, reward or inference errors, non-finite rewards; all masked out of the loss)
    logs a warning."""
    max_failed_steps: int = 3
    """Stop the run (TrainingError) after this many consecutive steps above
    ``train.max_error_rate`` (or with every rollout failed); 0 never stops."""
    mode: str = "sync"
    """sync: generate a batch, then train on it (on-policy). one_step_off: the batch of step
    k+1 generates while step k trains (staleness 1). async: batches stream in while the trainer
    consumes, bounded by ``max_staleness`` (docs/guides/async.md)."""
    max_staleness: int | None = None
    """mode=async only (required there): how many weight versions older than the trained
    policy any trained token may be; admission control holds back rollouts that could exceed
    it. 0 is sync."""
    drain_timeout_s: float = 300.0
    """On Ctrl-C (SIGINT) no new rollout starts, and what is generating finishes for at most
    this long and is trained (one_step_off/async: the admitted batches; sync: the step under
    way); a checkpoint follows. What is still in flight then is cancelled and redone on
    resume. A second Ctrl-C cancels at once; 0 cancels on the first (docs/guides/async.md)."""


@dataclass(kw_only=True)
class InferenceConfig:
    """The inference servers of a run, started on loopback next to the trainer (policy dtype).

    backend   servers                     weight_sync (auto ->)   other weight_sync choices
    embedded  python -m agentrl...server  ipc (shared memory)     tensors (HTTP buckets), disk,
                                                                  distributed (NCCL / gloo)
    vllm      vLLM (``python`` has vllm)  vllm (transfer engine)  disk
    sglang    sglang.launch_server        disk                    distributed
    """

    backend: str = "embedded"
    """embedded | vllm | sglang."""
    num_servers: int = 1
    placement: list[str] = field(default_factory=list)
    """Device of each server (server i gets placement[i % len]): cpu, cuda:0, ...; empty: the
    policy engine's device. vLLM/SGLang servers on cuda:N see only GPU N."""
    restart: ServerSupervisor.Config = field(default_factory=ServerSupervisor.Config)
    """Restart a dead server on its port and route to it again once it has the current weights."""
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    """Requests a server decodes together."""
    engine: str = "auto"
    """Embedded servers' engine: static (slot KV cache, CUDA graphs), dynamic (transformers'
    cache) or auto (static for llama/mistral/qwen2/qwen3 models); see docs/guides/inference.md."""
    kv_cache_gb: float = 0.0
    """Static engine: KV cache memory per server (0: 60% of the free GPU memory at its start,
    at most max_batch_size requests of 8192 tokens); set it when the trainer shares the GPU."""
    num_threads: int = 0
    """torch threads per server (0: one less than the CPU count on CPU, 2 on CUDA; embedded only)."""
    capture_graphs: str = "lazy"
    """Static engine on CUDA: capture each decode CUDA graph on first use (lazy) or every
    (batch-size, length) bucket's at server start (eager; all: the top-k/top-p variants too);
    no-op on CPU. Lazy here, unlike ``agentrl serve``: a run's servers have slots of the model's
    context (up to 8192 tokens: 15 length buckets x 9 batch buckets, ~0.15 s each on an H200)
    while its rollouts meet the few short-length buckets, once each."""
    compile_pointwise: bool = False
    """Static engine: torch.compile the decoder's elementwise runs into one kernel
    each before graphs are captured (``--compile-pointwise``; docs/guides/inference.md)."""
    prefill_every: int = 1
    """Embedded servers: while requests decode, admit waiting ones at most every N decode
    steps (``--prefill-every``), so next turns coming back a few a step share a prefill."""
    startup_timeout_s: float = 180.0
    verify_weights: bool = True
    """After each sync, compare the servers' weight checksums with the trainer's."""
    python: str = ""
    """Interpreter that has vllm / sglang installed (empty: this one)."""
    extra_args: list[str] = field(default_factory=list)
    """Flags passed verbatim to every server: vLLM / SGLang engine flags, e.g.
    ['--enforce-eager', '--kv-cache-memory-bytes', '268435456'], or the embedded server's
    (``python -m agentrl.inference.server --help``), e.g. ['--batch-wait-ms', '0']."""
    weight_sync: str = "auto"
    """tensors | disk | ipc | vllm | distributed | auto (the backend's own, see the table
    above). distributed: the driver joins a process group with every server (SGLang's
    init_weights_update_group) and broadcasts each tensor, over NCCL when the policy runs on
    CUDA and gloo on CPU; a restarted server gets the weights over HTTP (embedded) or from disk
    (SGLang), and the next sync forms a new group with every server."""
    weights_dir: str = ""
    """Where disk / file weight syncs write (empty: a temp dir, tmpfs when there is one)."""
    bucket_bytes: int = 256 << 20
    """Bytes per weight-sync bucket (HTTP body or file)."""
    interrupt: str = "off"
    """What a weight sync does to requests in flight (train.mode one_step_off / async):
    off: the servers update between two decode steps and the requests go on (the embedded
    server; vLLM's own sync waits with /pause?mode=keep); abort: the servers are paused with
    abort, the aborted requests wait, and after the update each asks for the rest of its
    tokens with its partial tokens appended to its prompt, so the rest is computed (prompt
    KV included) by the new weights. A trajectory's tokens then span versions either way."""

    def sync_path(self) -> str:
        """The weight-sync path ``weight_sync`` resolves to for this backend."""
        if self.weight_sync != "auto":
            return self.weight_sync
        return {"embedded": "ipc", "vllm": "vllm"}.get(self.backend, "disk")

    def validate(self) -> None:
        if self.interrupt not in ("off", "abort"):
            raise ConfigError(f"inference.interrupt must be off or abort, got {self.interrupt!r}")
        if self.engine not in ("auto", "static", "dynamic"):
            raise ConfigError(
                f"inference.engine must be auto, static or dynamic, got {self.engine!r}"
            )
        if self.capture_graphs not in ("eager", "lazy", "all"):
            raise ConfigError(
                f"inference.capture_graphs must be eager, lazy or all, got {self.capture_graphs!r}"
            )
        if self.prefill_every < 1:
            raise ConfigError(
                f"inference.prefill_every must be >= 1 (1: admit at every decode step), got "
                f"{self.prefill_every}"
            )
        paths = _SYNC_PATHS.get(self.backend)
        if paths is None:
            raise ConfigError(
                f"inference.backend must be one of {', '.join(_SYNC_PATHS)}, got {self.backend!r}"
            )
        if self.sync_path() not in paths:
            raise ConfigError(
                f"inference.weight_sync={self.weight_sync!r} does not work with "
                f"inference.backend={self.backend}; use one of auto, {', '.join(paths)}"
            )


_SYNC_PATHS = {
    "embedded": ("tensors", "disk", "ipc", "distributed"),
    "vllm": ("vllm", "disk"),
    "sglang": ("disk", "distributed"),
}


@dataclass(kw_only=True)
class SFTConfig:
    steps: int = 0
    """Optimizer steps of warm-up on env demonstrations before RL (0: none)."""
    lr: float = 1e-3
    lr_schedule: str = "cosine"
    """constant or cosine (decays to 0.1 * lr over sft.steps)."""
    batch_size: int = 16
    """Conversations per optimizer step."""
    num_demos: int = 256
    """Distinct demonstrations (seeds) to draw from the train envs."""
    dataset: str = ""
    """A JSONL/parquet file of conversations to train on instead of env demonstrations."""
    prompt_loss_weight: float = 0.0
    """Also train on the tokens the model does not write (prompt, observations), each
    weighing this much of a target token (0: targets only). Language modelling on the pages
    and outputs a demonstration repeats teaches a model trained from scratch to copy; a
    conversation's non-target tokens outnumber its targets ~25x in the GUI demonstrations,
    so 0.04 weighs both sides about the same. Torch-native engine only."""


@dataclass(kw_only=True)
class EvalConfig:
    num_samples: int = 32
    """Held-out samples evaluated before and after training (0: no eval)."""
    every: int = 0
    """Also evaluate every N RL steps (0: only before and after)."""
    temperature: float = 1.0


@dataclass(kw_only=True)
class RolloutWorkersConfig:
    """The ``rollout_workers`` section of a recipe: Ray actors that run the training
    rollouts (``trainers/rollout_workers.py``)."""

    num: int = 0
    """Ray actors that run the rollouts; 0: the driver's own event loop."""
    num_cpus: float = 1.0
    """CPUs each worker asks Ray for (its envs, tools and AgentLoops run there)."""
    resources: dict[str, float] = field(default_factory=dict)
    """Ray custom resources each worker asks for: pins the workers to nodes that offer them."""
    max_groups: int = 0
    """Groups one worker runs at once; 0: ceil(rollout.max_concurrency / rollout.group_size)."""
    max_restarts: int = 3
    """Restarts Ray gives a worker that died."""
    max_retries: int = 2
    """Attempts after the first for a group whose worker died; then its members are aborted."""
    routing_interval_s: float = 1.0
    """How often the driver's routable servers are compared with what the workers were told."""

    def validate(self) -> None:
        if self.num < 0:
            raise ConfigError(f"rollout_workers.num must be >= 0, got {self.num}")
        if self.num_cpus < 0:
            raise ConfigError(f"rollout_workers.num_cpus must be >= 0, got {self.num_cpus}")
        bad = {
            k: v for k, v in self.resources.items() if not (isinstance(v, int | float) and v > 0)
        }
        if bad:
            raise ConfigError(
                f"rollout_workers.resources must map a Ray resource name to an amount > 0, got "
                f"{bad}; e.g. rollout_workers.resources={{rollout: 1}}"
            )
        for name in ("max_groups", "max_restarts", "max_retries"):
            if getattr(self, name) < 0:
                raise ConfigError(f"rollout_workers.{name} must be >= 0, got {getattr(self, name)}")
        if self.routing_interval_s <= 0:
            raise ConfigError(
                f"rollout_workers.routing_interval_s must be > 0, got {self.routing_interval_s}"
            )


ENGINE_SECTIONS = ("megatron",)
"""Backends whose options have their own top-level section, named like the backend."""


@dataclass(kw_only=True)
class RunConfig:
    name: str = "run"
    output_dir: str = "runs"
    """The run directory is <output_dir>/<name>."""
    seed: int = 0
    modules: list[str] = field(default_factory=list)
    """Modules imported before names are resolved, for the envs/AgentLoops they register
    (like ``--module``: a name in the current directory or on sys.path, or a .py file)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: CollectorConfig = field(default_factory=CollectorConfig)
    rollout_workers: RolloutWorkersConfig = field(default_factory=RolloutWorkersConfig)
    """Ray actors that run the training rollouts (num 0: the driver's own event loop)."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    """The policy's engine (the reference model copies it with role=ref)."""
    critic: EngineConfig = field(default_factory=lambda: EngineConfig(role="critic"))
    """The critic's engine; used only with algo.adv_estimator=gae."""
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    """Options of engines with backend=megatron: parallel layout (world size = train.world_size)."""
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    checkpoint: CheckpointManager.Config = field(default_factory=CheckpointManager.Config)
    logging: MetricsLogger.Config = field(default_factory=MetricsLogger.Config)
    trajectories: TrajectoryLog.Config = field(default_factory=TrajectoryLog.Config)
    """A sample of each step's trajectories for `agentrl view` (<run_dir>/trajectories)."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self) -> None:
        if self.data.seed is None:
            self.data.seed = self.seed * 1_000_003
        if self.model.tiny.seed is None:
            self.model.tiny.seed = self.seed

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.name

    def backends_in_use(self) -> set[str]:
        """The engine backends this run builds: the policy's, and the critic's with GAE."""
        return {self.engine.backend} | (
            {self.critic.backend} if self.algo.adv_estimator == "gae" else set()
        )

    def engine_options(self, backend: str) -> object:
        """The config section a backend owns (``megatron:`` for ``megatron``), or None.

        An engine's own options live in the section named after its backend, and reach the
        engine through the registry (``ENGINES.make(backend, config=..., options=...)``), so the
        driver, SFT and the workers pass them on without knowing which engine they feed.
        """
        return getattr(self, backend, None) if backend in ENGINE_SECTIONS else None

    def validate(self) -> None:
        """Every check of ``trainers.config_checks``, then the sections' own."""
        from trainers.config_checks import check_run_config

        check_run_config(self)
        self.rollout_workers.validate()
        self.logging.validate()
        self.trajectories.validate()
        self.reward.build_rubric()


def load_run_config(recipe: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    """Defaults <- recipe YAML <- ``key=value`` overrides, validated."""
    return load_config(RunConfig, recipe, overrides)
