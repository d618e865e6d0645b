"""The RL driver: one loop, readable top to bottom, for every ``train.mode``.

    setup:  local Ray -> base model (tiny or HF dir) -> [SFT warm-up] -> embedded servers
            -> worker groups (actor, [ref], [critic]) -> [resume from the latest checkpoint]
    step:   collect groups (seeded, streaming) -> [remax: greedy baselines] -> TrainBatch
            -> [overlong penalty / filter] -> old/ref logprobs, values, [rollout IS weights]
            -> rewards (+KL) -> advantages -> critic + policy update -> [adaptive KL coef]
            -> [a sample of the trajectories for `agentrl view`]
            -> weight sync (inference.weight_sync: ipc by default, version+1) -> metrics
            -> checkpoint every N
    end:    eval -> export HF -> reward curve PNG + summary.json

Features are steps of ``Trainer.step`` (KL, critic, group filtering, overlong handling, rollout
IS correction, remax baselines), never a second loop. A ``reward.rubric`` rescores every group
inside the collector. ``train.mode`` is a step too: ``sync`` collects the batch in
``collect``; ``one_step_off`` and ``async`` take it from ``AsyncRollouts``
(trainers/async_rollout.py), which generates later batches while ``learn`` runs in a thread,
and train with the decoupled PPO objective (docs/guides/async.md); there Ctrl-C drains: no new
batch, the admitted ones are trained (``train.drain_timeout_s``), a checkpoint, exit 130.
The driver owns the data cursor (which samples come next), the weight version and the
run's RNG; the engines own model/optimizer/scheduler state; a checkpoint holds both.
"""

from __future__ import annotations

import logging
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from agentrl import heap
from agentrl.algos import (
    ADV_ESTIMATORS,
    AdaptiveKLController,
    AdvantageInputs,
    FixedKLController,
    ISCorrectionConfig,
    apply_kl_to_reward,
    kl_penalty,
    rollout_is_weights,
)
from agentrl.algos.aggregation import masked_mean
from agentrl.batch import TrainBatch
from agentrl.chat import ChatTemplate
from agentrl.config import to_dict, to_yaml
from agentrl.distributed import ResourcePool, ShardCache, WorkerGroup
from agentrl.distributed.traffic import TRAFFIC
from agentrl.gpu_env import apply_to_this_process
from agentrl.logging import MetricsLogger, Timer, mean_metrics, progress
from agentrl.metrics_schema import GENERATE_CPU_S, OVERLAP_S, StepCounts, step_metrics
from agentrl.rollout.collector import RolloutCollector
from agentrl.types import TrajectoryGroup
from trainers.async_rollout import (
    AsyncRollouts,
    CtrlCDrain,
    DrainTimeout,
    staleness_bound,
    staleness_metrics,
)
from trainers.checkpoint import (
    CheckpointManager,
    TrainerState,
    capture_rng,
    restore_rng,
    start_or_resume,
)
from trainers.config import KLConfig, RunConfig
from trainers.eval import eval_metrics, logged_eval, write_report
from trainers.failures import FailureGuard
from trainers.group_filter import GroupFilter
from trainers.plan import make_plan
from trainers.rollout_workers import RolloutWorkerPool
from trainers.runtime import (
    exit_on_sigterm,
    pool_config,
    seed_everything,
    start_ray,
    threads_per_rank,
)
from trainers.serving import Fleet
from trainers.sft import warm_up
from trainers.shaping import apply_overlong, set_greedy_baselines
from trainers.trajectory_log import TrajectoryLog
from trainers.updates import report_skipped_updates
from trainers.workers import (
    ActorWorker,
    CriticUpdate,
    CriticWorker,
    PolicyUpdate,
    RefWorker,
    build_roles,
)

logger = logging.getLogger(__name__)


class Trainer:
    """Runs one RL training run described by a RunConfig. ``Trainer(cfg).run()`` -> summary."""

    def __init__(self, cfg: RunConfig, *, resume: bool = False, command: str | None = None) -> None:
        self.cfg = cfg
        self.resume = resume
        self.command = command  # the CLI line that started the run, kept in summary.json
        self.run_dir = cfg.run_dir
        self.ckpt = CheckpointManager(cfg.checkpoint, self.run_dir)
        self.timer = Timer()
        self.step_done = 0  # completed RL steps
        self.version = 0  # weight version on the servers
        self.cursor = 0  # next train sample index
        self.failures = FailureGuard(cfg.train, self.run_dir / "logs")
        self.kl_ctl = kl_controller(cfg.algo.kl)  # its value is checkpointed
        self._groups: list[WorkerGroup[Any]] = []
        self._gen_tokens = 0  # tokens generated in this step's collect(), filtered groups too
        self._pool: ResourcePool | None = None
        self._owns_ray = False
        self.fleet: Fleet | None = None
        self.rollouts: AsyncRollouts | None = None  # one_step_off / async: the producer
        self.workers: RolloutWorkerPool | None = None  # rollout_workers.num > 0: Ray actors
        self.bound = staleness_bound(cfg.train.mode, cfg.train.max_staleness)
        self.metrics_log: MetricsLogger | None = None
        self.trajectory_log = TrajectoryLog(cfg.trajectories, self.run_dir)
        self.ctrl_c = CtrlCDrain(cfg.train.drain_timeout_s)  # overlapped modes: Ctrl-C drains

    # ------------------------------------------------------------------ the whole run
    def run(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        try:
            self.setup()
            before = self.evaluate_once("before", step=0)
            todo = self.cfg.train.steps - self.step_done
            # a terminal has the console's per-step tables; logs get a line per tenth with an ETA
            # the controller's event loop runs every rollout: what setup built (torch, Ray, the
            # tokenizer, the envs' modules) stays out of the collector's full passes meanwhile
            with (
                heap.frozen(),
                progress("RL steps", todo, enabled=not sys.stderr.isatty()) as advance,
            ):
                while self.step_done < self.cfg.train.steps:
                    if self.ctrl_c.interrupted and not self.ctrl_c.admitted(self.step_done + 1):
                        break
                    try:
                        self.step()
                    except DrainTimeout as e:
                        logger.warning("Ctrl-C: %s; cancelling them (re-admitted on resume)", e)
                        break
                    advance()
            self.ctrl_c.restore()
            if self.ctrl_c.interrupted:
                self._stop_drained()
            after = self.evaluate_once("after", step=self.step_done)
            return self.finish(before, after, time.perf_counter() - t0)
        except (KeyboardInterrupt, SystemExit):
            self.ctrl_c.restore()
            logger.warning(
                "stopped after %d of %d RL steps; %s",
                self.step_done,
                self.cfg.train.steps,
                self.resume_hint(),
            )
            raise
        finally:
            self.close()

    # ------------------------------------------------------------------ Ctrl-C: drain
    def _stop_drained(self) -> None:
        """After a drain: checkpoint the last trained step (unless saved), say so, exit 130."""
        if not self.step_done:
            logger.warning("Ctrl-C: stopped before any RL step was trained")
            raise SystemExit(128 + signal.SIGINT)
        if self.ckpt.latest() != self.ckpt.path_for(self.step_done):
            self.save_checkpoint()
        drained = self.ctrl_c.drained
        first = drained[0] if drained else None
        logger.warning(
            "Ctrl-C: drained; %s. Checkpoint %s holds step %d (data cursor %d); "
            "nothing in flight was lost",
            f"trained steps {first}..{drained[-1]} after it"
            if first is not None
            else "no admitted batch was left to train",
            self.ckpt.latest(),
            self.step_done,
            self.cursor,
        )
        raise SystemExit(128 + signal.SIGINT)

    def resume_hint(self) -> str:
        """How to continue this run from its latest checkpoint."""
        latest = self.ckpt.latest()
        if latest is None:
            return "no checkpoint was written yet (checkpoint.every), so a rerun starts over"
        command = self.command or f"agentrl train <recipe> name={self.cfg.name}"
        if "--resume" not in command.split():
            command += " --resume"
        return f"continue from {latest} with: {command}"

    def setup(self) -> None:
        cfg = self.cfg
        state = start_or_resume(self.ckpt, self.run_dir, to_yaml(cfg), resume=self.resume)
        seed_everything(cfg.seed)
        apply_to_this_process()  # NVLink multicast off here too (agentrl.gpu_env)
        ray_gpus = None
        if torch.cuda.is_available():  # which GPUs train and which serve (trainers/plan.py)
            plan = make_plan(cfg, torch.cuda.device_count())
            logger.info("placement plan:\n%s", plan.render())
            ray_gpus = plan.ray_gpus
        self._owns_ray = start_ray(cfg.train.num_cpus, num_gpus=ray_gpus)
        exit_on_sigterm()  # after ray.init, which installs its own handler
        self.policy_path = warm_up(cfg, num_threads=threads_per_rank(cfg))
        self._pool = ResourcePool(pool_config(cfg))
        self.template = ChatTemplate.from_pretrained(self.policy_path)
        self.pad_id = int(self.template.tokenizer.pad_token_id)
        self.fleet = Fleet.for_run(cfg, self.run_dir / "logs")
        self.fleet.start_beside(self.policy_path, self._build_workers)
        self.rubric = cfg.reward.build_rubric()
        self.collector = self.fleet.collector(cfg.rollout, self.template, rubric=self.rubric)
        if cfg.rollout_workers.num:
            self.workers = RolloutWorkerPool.for_run(cfg, self.fleet, self.policy_path)
        if state is not None:
            self._restore(state)
        if cfg.train.mode != "sync":
            self.rollouts = self._async_rollouts()
        self.ctrl_c.install(self.rollouts)
        self.metrics_log = MetricsLogger(
            cfg.logging, self.run_dir, name=cfg.name, run_config=to_dict(cfg)
        )

    # ------------------------------------------------------------------ one RL step
    def step(self) -> dict[str, float]:
        cfg, step = self.cfg, self.step_done + 1
        t_step = time.perf_counter()
        TRAFFIC.take()  # what the step before left (checkpoint, eval) is not this step's
        self._gen_tokens = 0
        cpu = time.thread_time()
        with self.timer.time("generate"):
            groups, filter_metrics = self.collect() if self.rollouts is None else self.take(step)
        cpu = time.thread_time() - cpu
        self.failures.check(groups, step)
        batch = TrainBatch.from_groups(groups, self.pad_id)
        metrics = {**RolloutCollector.metrics(groups), **filter_metrics}
        if self.rollouts is None and self.workers is None and self.fleet is not None:
            metrics[GENERATE_CPU_S] = cpu  # sync, rolled out by this thread: the phase's own CPU
        if self.fleet is not None:  # the servers' work since the last step (overlapped: any batch)
            metrics |= self.fleet.engine_metrics()
        if self.rollouts is not None:  # raises if a token is older than the bound
            metrics |= staleness_metrics(batch.versions, batch.loss_mask, self.version, self.bound)
            metrics |= self.rollouts.overlap(lambda: self.learn(step, groups, batch))
            metrics[OVERLAP_S] = self.rollouts.overlap_s
        else:
            metrics |= self.learn(step, groups, batch)
        if self.ref is not None:  # the coefficient of the next step (adaptive controller)
            self.kl_ctl.update(metrics["train/kl"], n_steps=int(batch.sample_mask.sum()))
        with self.timer.time("sync"):
            self.sync_weights(self.version + 1)
        if self.rollouts is not None:
            self.rollouts.after_sync()  # admission control: the new version may admit a batch
        self.step_done = step  # the data cursor moved in collect() / take()
        metrics |= self.fleet.metrics() if self.fleet is not None else {}
        metrics |= self.workers.metrics() if self.workers is not None else {}
        counts = StepCounts(
            gen_tokens=self._gen_tokens,
            train_tokens=batch.num_tokens * cfg.train.ppo_epochs,
            samples=sum(len(g.trajectories) for g in groups),
        )
        step_s = time.perf_counter() - t_step
        metrics |= step_metrics(self.timer.pop(), step_s=step_s, counts=counts)
        metrics |= TRAFFIC.take()
        metrics["train/weight_version"] = float(self.version)
        metrics["train/data_cursor"] = float(self.cursor)
        assert self.metrics_log is not None
        self.metrics_log.log(metrics, step)  # before the checkpoint: a resumed run has every row
        if self.ctrl_c.interrupted:
            self.ctrl_c.drained.append(step)
        if self.ckpt.should_save(step, cfg.train.steps):
            self.save_checkpoint()
        if cfg.eval.every and step % cfg.eval.every == 0 and step < cfg.train.steps:
            self.metrics_log.log(self.evaluate(f"step {step}"), step)
        return metrics

    def learn(
        self, step: int, groups: list[TrajectoryGroup], batch: TrainBatch
    ) -> dict[str, float]:
        """Everything between a batch and its weight sync (in a thread in overlapped modes)."""
        metrics: dict[str, float] = {}
        if self.cfg.algo.adv_estimator == "remax":
            with self.timer.time("baseline"):
                metrics |= self.greedy_baselines(groups, batch)
        metrics |= self.overlong(batch)
        with self.timer.time("logprob"):
            metrics |= self.score(batch)
        with self.timer.time("adv"):
            metrics |= self.advantages(batch)
        with self.timer.time("update"):
            metrics |= self.update(batch)
        self.trajectory_log.write(step, groups, batch)  # for `agentrl view`
        report_skipped_updates(metrics, step)
        return metrics

    def take(self, step: int) -> tuple[list[TrajectoryGroup], dict[str, float]]:
        """Overlapped modes: step ``step``'s groups from the producer, and its buffer metrics."""
        assert self.rollouts is not None
        groups, metrics = self.rollouts.next_batch(step)
        self.cursor += self.rollouts.stride  # the next step's first sample: where a resume starts
        self._gen_tokens += sum(t.num_generated_tokens for g in groups for t in g.trajectories)
        return groups, metrics

    def _async_rollouts(self) -> AsyncRollouts:
        assert self.fleet is not None and self.fleet.generator is not None
        return AsyncRollouts(
            mode=self.cfg.train.mode,
            bound=self.bound,
            batch_size=self.cfg.train.batch_size,
            first_step=self.step_done + 1,
            last_step=self.cfg.train.steps,
            first_sample=self.cursor,
            sample=self.cfg.data.sample,
            collect=self.workers.collect_ordered
            if self.workers
            else self.collector.collect_ordered,
            forget=self.workers.forget if self.workers else self.fleet.generator.forget,
            version=lambda: self.version,
            loop=self.fleet.loop,
            filter_rounds=self.cfg.algo.max_filter_rounds if self.cfg.algo.filter_groups else None,
        )

    def collect(self) -> tuple[list[TrajectoryGroup], dict[str, float]]:
        """``train.batch_size`` groups; with ``algo.filter_groups`` only groups with reward
        signal, drawn round after round from the data cursor (``trainers/group_filter.py``)."""
        n, algo = self.cfg.train.batch_size, self.cfg.algo
        batch = GroupFilter(target=n, max_rounds=algo.max_filter_rounds)
        missing, first = n, self.cursor
        while True:
            samples = [self.cfg.data.sample(self.cursor + i) for i in range(missing)]
            self.cursor += len(samples)
            assert self.fleet is not None
            try:  # after a Ctrl-C, within train.drain_timeout_s
                groups = self.fleet.collect(
                    self.workers or self.collector, samples, guard=self.ctrl_c.bounded
                )
            except DrainTimeout:
                self.cursor = first  # nothing of this step trained: a resume redoes it
                raise
            self._gen_tokens += sum(t.num_generated_tokens for g in groups for t in g.trajectories)
            if not algo.filter_groups:
                return groups, {}
            missing = batch.add(groups)
            if not missing:
                return batch.result()

    def score(self, batch: TrainBatch) -> dict[str, float]:
        """Old logprobs (recomputed by the actor), reference logprobs and critic values; the
        batch is put in the object store once and each call returns only its new field."""
        cfg = self.cfg
        temp = cfg.rollout.temperature
        shards = ShardCache(batch)
        lp = self.actor.call_sharded(ActorWorker.compute_logprobs, shards.on(self.actor), temp)
        batch.add_fields(lp, {"logprobs": "old_logprobs"})
        if self.ref is not None:
            ref = self.ref.call_sharded(RefWorker.compute_logprobs, shards.on(self.ref), temp)
            batch.add_fields(ref, {"logprobs": "ref_logprobs"})
        if self.critic is not None:
            values = self.critic.call_sharded(CriticWorker.compute_values, shards.on(self.critic))
            batch.add_fields(values)
        mask = batch.loss_mask
        diff = (batch["old_logprobs"] - batch.rollout_logprobs).abs()
        out = {
            "train/rollout_logprob_diff": float(masked_mean(diff, mask)),
            "train/rollout_logprob_diff_max": float((diff * mask).max()) if mask.any() else 0.0,
            "train/num_loss_tokens": float(mask.sum()),
        }
        if self.ref is not None:  # what the KL controller reads, in either KL mode
            kl = kl_penalty(batch["old_logprobs"], batch["ref_logprobs"], cfg.algo.kl.type)
            out["train/kl"] = float(masked_mean(kl, mask))
            out["train/kl_coef"] = self.kl_ctl.value
        ris = cfg.algo.rollout_is
        if ris.enabled or self.bound:  # sampled from mu (older weights, other kernels): reweight
            is_cfg = ISCorrectionConfig(level=ris.level, cap=ris.cap)  # type: ignore[arg-type]
            weights, m = rollout_is_weights(
                batch["old_logprobs"], batch.rollout_logprobs, mask, is_cfg
            )
            batch["is_weights"] = weights  # (B, T), read by the policy loss
            out |= {f"train/is_{k.removeprefix('is_')}": float(v) for k, v in m.items()}
        return out

    def advantages(self, batch: TrainBatch) -> dict[str, float]:
        """Rewards (minus KL when it is a reward penalty) -> advantages and returns."""
        algo = self.cfg.algo
        out: dict[str, float] = {}
        token_rewards = batch.token_rewards
        if self.ref is not None and algo.kl.in_reward:
            token_rewards, kl_m = apply_kl_to_reward(
                token_rewards,
                batch["old_logprobs"],
                batch["ref_logprobs"],
                batch.loss_mask,
                kind=algo.kl.type,
                coef=self.kl_ctl.value,
            )
            out = {f"train/{k}": float(v) for k, v in kl_m.items()}
        inputs = AdvantageInputs(
            response_mask=batch.loss_mask,
            token_rewards=token_rewards,
            values=batch["values"] if self.critic is not None else None,
            group_ids=batch.group_ids,
            baseline_rewards=batch["baseline_rewards"] if algo.adv_estimator == "remax" else None,
        )
        scores = inputs.scores()
        rows = batch.sample_mask.bool()
        out["train/score_mean"] = float(scores[rows].mean()) if rows.any() else 0.0
        adv, returns = ADV_ESTIMATORS.get(algo.adv_estimator)(inputs, algo.adv)
        batch["advantages"], batch["returns"] = adv, returns
        out["train/advantage_abs_mean"] = float(masked_mean(adv.abs(), batch.loss_mask))
        return out

    def update(self, batch: TrainBatch) -> dict[str, float]:
        """Critic first (it reads the old values), then the policy, over PPO epochs/mini-batches."""
        cfg = self.cfg
        out: dict[str, float] = {}
        num_mini = cfg.train.batch_size // (cfg.train.mini_batch_size or cfg.train.batch_size)
        shards = ShardCache(batch)  # the scored batch, put once for the critic and the policy
        if self.critic is not None:
            spec_c = CriticUpdate(
                value_clip=cfg.algo.value_clip,
                agg=cfg.algo.loss_agg,
                epochs=cfg.train.ppo_epochs,
                num_mini_batches=num_mini,
            )
            on = shards.on(self.critic)
            out |= mean_metrics(self.critic.call_sharded(CriticWorker.update_critic, on, spec_c))
        kl = cfg.algo.kl
        spec = PolicyUpdate(
            loss=cfg.algo.policy_loss,
            loss_cfg=cfg.algo.clip,
            agg=cfg.algo.loss_agg,
            entropy_coef=cfg.algo.entropy_coef,
            kl_coef=self.kl_ctl.value if (self.ref is not None and not kl.in_reward) else 0.0,
            kl_type=kl.type,
            epochs=cfg.train.ppo_epochs,
            num_mini_batches=num_mini,
            temperature=cfg.rollout.temperature,
            is_weights=cfg.algo.rollout_is.enabled or self.bound > 0,  # decoupled PPO
        )
        policy = self.actor.call_sharded(ActorWorker.update_policy, shards.on(self.actor), spec)
        out |= mean_metrics(policy)
        return out

    def greedy_baselines(
        self, groups: list[TrajectoryGroup], batch: TrainBatch
    ) -> dict[str, float]:
        """ReMax: one greedy (temperature 0) rollout of each group's sample, scored like the
        group (same rubric, same overlong penalty); its reward is the group's baseline."""
        assert self.fleet is not None
        greedy_cfg = replace(self.cfg.rollout, group_size=1, temperature=0.0)
        collector = self.fleet.collector(greedy_cfg, self.template, rubric=self.rubric)
        greedy = self.fleet.collect(collector, [g.trajectories[0].sample for g in groups])
        return set_greedy_baselines(batch, groups, greedy, self.cfg.algo.overlong)

    def overlong(self, batch: TrainBatch) -> dict[str, float]:
        """DAPO overlong handling on ``batch`` (``trainers.shaping.apply_overlong``)."""
        return apply_overlong(batch, self.cfg.algo.overlong)

    def sync_weights(self, version: int) -> None:
        """Actor weights -> every server by ``inference.weight_sync`` (the embedded server's
        default is ipc: shared memory on this machine; ``tensors`` goes over HTTP), tagged
        ``version``, checksum-verified."""
        assert self.fleet is not None
        named = self.actor.call(ActorWorker.named_weights)
        self.fleet.sync(named, version, verify=self.cfg.inference.verify_weights)
        self.version = version

    # ------------------------------------------------------------------ workers, checkpoints
    def _build_workers(self) -> None:
        assert self._pool is not None
        roles = build_roles(self.cfg, self._pool, self.policy_path, threads_per_rank(self.cfg))
        self.actor, self.ref, self.critic = roles.actor, roles.ref, roles.critic
        self._groups = roles.groups

    def save_checkpoint(self) -> Path:
        tmp = self.ckpt.begin(self.step_done)
        self.actor.call(ActorWorker.save, str(tmp / "actor"))
        if self.critic is not None:
            self.critic.call(CriticWorker.save, str(tmp / "critic"))
        extra = {"policy_path": str(self.policy_path), "kl_coef": self.kl_ctl.value}
        state = TrainerState(
            step=self.step_done,
            weight_version=self.version,
            data_cursor=self.cursor,
            rng=capture_rng(),
            extra=extra,
        )
        return self.ckpt.commit(tmp, state)

    def _restore(self, state: TrainerState) -> None:
        path = self.ckpt.path_for(state.step)
        self.actor.call(ActorWorker.load, str(path / "actor"))
        if self.critic is not None:
            self.critic.call(CriticWorker.load, str(path / "critic"))
        self.step_done, self.cursor = state.step, state.data_cursor
        if self.cfg.algo.kl.controller == "adaptive" and "kl_coef" in state.extra:
            self.kl_ctl.value = float(state.extra["kl_coef"])  # a fixed coef is the config's
        self.sync_weights(state.weight_version)
        restore_rng(state.rng)

    # ------------------------------------------------------------------ eval and the end
    def evaluate_once(self, label: str, *, step: int) -> dict[str, float]:
        """The eval logged at ``step`` (0: before RL), run only if metrics.jsonl lacks it.

        A resumed run reuses the "before" eval of its first session, and a finished run
        resumed again reuses its "after" eval, so its summary and plot equal an
        uninterrupted run's and no eval row is written twice.
        """
        logged = logged_eval(self.run_dir / "metrics.jsonl", step)
        if logged is not None:
            return logged
        m = self.evaluate(label)
        if m:
            assert self.metrics_log is not None
            self.metrics_log.log(m, step)
        return m

    def evaluate(self, label: str) -> dict[str, float]:
        if not self.cfg.eval.num_samples:
            return {}
        assert self.fleet is not None
        m = eval_metrics(self.fleet, self.cfg, self.template)
        self.fleet.engine_metrics()  # the next step's engine counters start after the eval
        logger.info(
            "eval (%s): reward %.3f, success %.3f",
            label,
            m["eval/reward_mean"],
            m["eval/success_rate"],
        )
        return m

    def finish(
        self, before: dict[str, float], after: dict[str, float], wall_s: float
    ) -> dict[str, Any]:
        hf_dir = None
        if self.cfg.checkpoint.export_hf:
            hf_dir = self.run_dir / "hf"
            self.actor.call(ActorWorker.export_hf, str(hf_dir))
        return write_report(
            self.run_dir,
            before=before,
            after=after,
            wall_s=wall_s,
            steps=self.step_done,
            hf_dir=hf_dir,
            seed=self.cfg.seed,
            command=self.command,
            eval_fraction=self.cfg.data.eval_fraction,
        )

    def close(self) -> None:
        self.ctrl_c.restore()  # an error may leave the loop with the drain's handler set
        if self.rollouts is not None:  # in-flight rollouts: cancelled, re-admitted on resume
            self.rollouts.close()
            self.rollouts = None
        if self.workers is not None:
            self.workers.close()
            self.workers = None
        if self.fleet is not None:  # first: server processes outlive a driver that dies here
            self.fleet.close()
            self.fleet = None
        for g in reversed(self._groups):
            g.shutdown()
        self._groups = []
        if self.metrics_log is not None:
            self.metrics_log.close()
        if self._owns_ray:
            import ray

            ray.shutdown()


def kl_controller(kl: KLConfig) -> FixedKLController | AdaptiveKLController:
    """The KL coefficient's controller (``algo.kl.controller``), starting at ``algo.kl.coef``."""
    if kl.controller == "adaptive":
        return AdaptiveKLController(value=kl.coef, target=kl.target, horizon=kl.horizon)
    return FixedKLController(value=kl.coef)
