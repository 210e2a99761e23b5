"""The training loop: data -> model -> loss -> backward -> all-reduce -> optimizer, then evaluation.

`run(config)` trains and returns the summary, only sequencing named parts (minidl.training):
the step (eager or CUDA-graph), the evaluator, checkpoints, outputs, the step timer, and the
hooks triggered around each step (minidl.training.parts). The epoch's end (metrics,
evaluation, its checkpoint, the stop decided over all ranks) stays in `run`, not in a part,
since it follows only a complete epoch. A run is a pure function of its configuration and its
checkpoint, so a resumed run continues exactly where the checkpoint was taken.

Details: docs/training.md, "minidl/trainer.py".
"""
import dataclasses
import math
import os
import socket
import time
from minidl import amp, distributed, environment, kernels
from minidl.backend import on_gpu, synchronize
from minidl.checkpoint import CheckpointDir
from minidl.distributed import watchdog
from minidl.distributed.allreduce import on_grid
from minidl.distributed.grid import bucket_sizes
from minidl.errors import UserError
from minidl.training import parts
from minidl.training.build import agree_on_kernel_plans, build_model, build_optimizer, build_schedule
from minidl.training.data import RunData
from minidl.training.evaluator import Evaluator
from minidl.training.memory import naming_the_batch
from minidl.training.outputs import RunOutputs, check_writable
from minidl.training.position import EpochTotals, Position
from minidl.training.preemption import StopRequest, stopped_line
from minidl.training.state import RunState, adopt_checkpoint_batches, find_resume_point
from minidl.training.steps import EagerStep, GraphedTrainStep
from minidl.training.stragglers import Stragglers
from minidl.training.timer import StepTimer
from minidl.training.trace import RunTrace


@dataclasses.dataclass
class Epoch:
    """One epoch's plan of batches, its optimizer steps and loader, and when its loss is logged."""
    plan: object
    steps: int
    loader: object
    batches: object          # the loader's iterator, from the position on
    skipped_before: int      # undecodable images of the epoch before this loader's
    logged: object           # trigger on the steps done: log (and check the loss) after this step


class TrainingStopped(Exception):
    """The run cannot go on (e.g. a non-finite loss); the message says why and what was saved."""


class Trainer:
    """Everything a run holds: communicator, data, model, optimizer, schedule, parts, position."""

    def __init__(self, config, comm):
        self.config, self.comm = config, comm
        self.outputs = RunOutputs(config.output_dir, comm.rank == 0)
        self.data = RunData(config, comm)
        self.schedule = build_schedule(config, comm.size)
        self.model = build_model(config, len(self.data.train_set.classes))
        agree_on_kernel_plans(comm)
        shape = distributed.parse_shape(config.torus_shape) if config.torus_shape else None
        self.grid = self._choose_grid(shape) if on_grid(config.allreduce) and comm.size > 1 else None
        self.allreduce = distributed.AllReduce(comm, config.allreduce, self.grid.shape if self.grid else shape)
        distributed.broadcast_state(comm, self.model.state_dict().values())
        self.optimizer = build_optimizer(config, self.model, math.lcm(1024, self.allreduce.alignment))
        if config.amp:
            amp.enable(self.model, self.optimizer)
        self.reducer = distributed.GradientReducer(self.allreduce, self.optimizer.flat, config.bucket_mb)
        self.position, self.totals = Position(), EpochTotals()
        self.stragglers = Stragglers() if comm.size > 1 and comm.rank == 0 else None  # rank 0 reports them
        self.graphs_wanted = self._graphs_possible()
        self.timer = StepTimer((lambda: None) if self.graphs_wanted else synchronize)  # a graph never waits
        self.eager = EagerStep(self.model, self.optimizer, self.reducer, self.timer, self.totals,
                               config.label_smoothing)
        self.graphed = None  # the captured step of the current micro-batch size
        self.step = self.eager  # the current epoch's
        self.evaluate = Evaluator(self.model, self.optimizer, self.data.val_loader(self.plan(0).micro_batch), comm,
                                  config.label_smoothing)
        self.state = RunState(config, comm, self.model, self.optimizer, self.schedule,
                              CheckpointDir(config.output_dir, config.keep_checkpoints))
        self.trace = RunTrace(config.trace_steps, config.trace_path, comm, self.model, self.reducer, self.timer,
                              self.outputs) if config.trace_steps else None

    def _choose_grid(self, shape):
        """The torus grid: `shape` (--torus-shape), else the cost model's fastest for this job's layout
        and the run's buckets (minidl.distributed.grid), with the predictions that explain it."""
        float32_gradient = 4 * self.model.num_parameters()
        return distributed.choose_grid(self.comm, bucket_sizes(float32_gradient, self.config.bucket_mb), shape)

    def _graphs_possible(self):
        """--cuda-graph: whether this run's steps can be captured (else they all run eagerly)."""
        if not self.config.cuda_graph:
            return False
        if self.comm.size > 1 or self.config.opt != "sgd":
            why = f"{self.comm.size} processes" if self.comm.size > 1 else f"--opt {self.config.opt}"
            self.outputs.notice(f"--cuda-graph captures single-process SGD runs; with {why} every step runs eagerly")
            return False
        return True

    def any_rank(self, *flags, timing=()):
        """For each flag, whether it is true on any rank: decisions that change the collectives
        every rank makes (stop now, save now) must be the same on all of them. Collective.
        `timing`, this rank's (compute, wait) seconds of the step, rides along to the straggler
        statistics: every rank's in the same one small collective."""
        if self.comm.size == 1:
            return tuple(bool(flag) for flag in flags)
        rows = self.comm.allgather_values([*flags, *timing])
        if timing and self.stragglers:
            self.stragglers.add(rows[:, len(flags):])
        return tuple(bool(flag) for flag in rows[:, :len(flags)].any(axis=0))

    def step_timing(self):
        """This rank's (compute, wait) seconds of the step so far: data, forward and backward;
        the exposed wait for the reduction."""
        phases = self.timer.this_step
        return phases["data"] + phases["forward"] + phases["backward"], phases["allreduce"]

    def plan(self, epoch):
        plan = self.schedule.batches.plan(epoch, self.comm.size, self.config.max_per_rank_batch)
        group = self.config.bn_group_size
        if group and plan.micro_batch > group and plan.micro_batch % group:
            raise UserError(f"--bn-group-size {group} does not divide the micro-batch of {plan.micro_batch} images "
                            f"per rank (epoch {epoch}): choose a divisor of it")
        return plan

    def step_for(self, plan):
        """This epoch's step: replayed from a CUDA graph where the run and the plan allow, else eager."""
        if not self.graphs_wanted:
            return self.eager
        if plan.accum_steps > 1:
            self.outputs.notice(f"--cuda-graph: epoch {self.position.epoch + 1} accumulates {plan.accum_steps} "
                                "micro-batches per step, which is not captured: its steps run eagerly")
            return self.eager
        shape = (plan.micro_batch, *self.data.train_transform.output_shape)
        if self.graphed is None or self.graphed.images_shape != shape:
            self.graphed = None  # the old graph's memory goes back before the new one's is taken
            self.graphed = GraphedTrainStep(self.model, self.optimizer, self.timer, self.totals,
                                            self.config.label_smoothing, self.config.amp, shape)
        return self.graphed

    def save_checkpoint(self, diagnostic=False):
        watchdog.doing("checkpoint")
        self.step.settle()
        return self.state.save(self.position, self.totals, diagnostic)

    def train_epoch(self, stop):
        """Train from the current position to the end of the epoch, or until asked to stop: each step
        between the hooks of the epoch's parts (minidl.training.parts). Returns True when the epoch is complete."""
        epoch = self.begin_epoch()
        around = self.parts_for(epoch)
        stopping = False
        while self.position.step < epoch.steps and not stopping:
            for part in around:
                part.before_step(self.position)
            stopping = self.train_step(epoch, stop)
            self.position.advance()
            for part in around:
                part.after_step(self.position, stopping)
        for part in around:
            part.epoch_end()
        return not stopping

    def begin_epoch(self):
        """The current epoch's plan, steps and step, its loader at the position; the model in training mode."""
        position, plan = self.position, self.plan(self.position.epoch)
        loader = self.data.train_loader(plan.micro_batch)
        steps = len(loader) // plan.accum_steps
        if steps == 0:
            raise UserError(f"the training set ({len(self.data.train_set)} images) is smaller than the global batch "
                            f"{plan.global_batch} of epoch {position.epoch}: lower the batch size")
        loader.set_epoch(position.epoch, start_batch=position.step * plan.accum_steps)
        self.optimizer.grad_scale = 1.0 / (self.comm.size * plan.accum_steps)
        self.model.train()
        self.step = self.step_for(plan)
        return Epoch(plan, steps, loader, iter(loader), self.totals.skipped, parts.every(self.config.print_freq, steps))

    def parts_for(self, epoch):
        """What runs around each step of `epoch`, in the order of its hooks."""
        config, position = self.config, self.position
        bar = self.outputs.progress_bar(position.epoch, config.epochs, epoch.steps, position.step)
        return [parts.WatchdogStep(),
                *([parts.TraceWindow(self.trace)] if self.trace is not None else []),
                parts.Progress(bar, epoch.logged, epoch.plan.global_batch,
                               lambda bar, rate: self.log_steps(bar, epoch.plan, epoch.steps, rate)),
                parts.Checkpoints(config.checkpoint_every, epoch.steps, self.save_checkpoint)]

    def train_step(self, epoch, stop):
        """One optimizer step of `epoch`: its micro-batches, then ONE collective decides over all ranks
        whether the loss is non-finite (the run stops with a diagnostic checkpoint) and whether to stop
        after this step (returned), the step's timing riding along; then the update."""
        plan, step, position = epoch.plan, self.step, self.position
        step.begin(self.schedule(position.epoch + position.step / epoch.steps))
        for k in range(plan.accum_steps):
            watchdog.doing("data")
            images, labels = next(epoch.batches)
            self.timer.mark("data")
            if len(labels):  # else every image of the batch was undecodable
                with naming_the_batch(plan.micro_batch):
                    step.micro_batch(images, labels, last=k == plan.accum_steps - 1)
        watchdog.doing("decision")
        nonfinite, stopping = self.any_rank(step.end(check=epoch.logged(position.step + 1)), stop.requested is not None,
                                            timing=self.step_timing() if self.comm.size > 1 else ())
        self.totals.skipped = epoch.skipped_before + epoch.loader.skipped
        if nonfinite:
            self.stop_for_nonfinite_loss()
        watchdog.doing("update")
        step.update()
        self.timer.mark("optimizer")
        self.timer.end_step()
        return stopping

    def stop_for_nonfinite_loss(self):
        path = self.save_checkpoint(diagnostic=True)
        p = self.position
        where = (f"at iteration {p.iteration + 1} (epoch {p.epoch + 1}, step {p.step + 1}); the state before it"
                 if self.step is self.eager else
                 f"by iteration {p.iteration + 1} (epoch {p.epoch + 1}, step {p.step + 1}; --cuda-graph checks "
                 "every --print-freq steps); the state after it")
        raise TrainingStopped(f"non-finite loss {where} is saved in {path}: lower --lr or lengthen the warmup, then "
                              "--resume from the last regular checkpoint")

    def log_steps(self, bar, plan, steps, images_per_sec):
        split = self.timer.report()
        totals = self.comm.sum([self.totals.loss_sum, self.totals.images])
        record = {"iteration": self.position.iteration, "epoch": self.position.epoch + self.position.step / steps,
                  "loss": totals[0] / max(totals[1], 1), "lr": self.optimizer.lr, "global_batch": plan.global_batch,
                  "img_per_s": images_per_sec, **split, **(self.stragglers.report() if self.stragglers else {})}
        self.outputs.steps(bar, record)

    def finish_epoch(self, seconds):
        """The epoch's metrics (over all ranks); then the position moves to the next epoch."""
        totals, plan = self.totals, self.plan(self.position.epoch)
        loss_sum, images, skipped = self.comm.sum([totals.loss_sum, totals.images, totals.skipped])
        metrics = {"epoch": self.position.epoch + 1, "train_loss": loss_sum / max(images, 1), "lr": self.optimizer.lr,
                   "global_batch": plan.global_batch, "images_per_sec": images / seconds,
                   "train_skipped": int(skipped)}
        split = self.timer.epoch_report()
        if self.comm.size > 1:  # rank 0's communication per step: the wait after backward, and all of it
            metrics.update(allreduce_seconds=split["allreduce"], communication_seconds=split.get("communication", 0.0),
                           **(self.stragglers.epoch_report() if self.stragglers else {}))
        with naming_the_batch(plan.micro_batch):
            metrics.update(self.evaluate() if self.trace is None else self.trace.around_evaluation(self.evaluate))
        self.position.next_epoch()
        totals.reset()
        return metrics

    def resume(self, resume_point):
        self.position, totals = self.state.restore(*resume_point)
        self.totals.assign(totals)  # the steps add into this very object


def run(config):
    """Train as `config` says; return the summary (also written to summary.json)."""
    config = config.resolved()
    comm = distributed.init(config.dist_backend or ("nccl" if on_gpu else "mpi"))
    if comm.rank == 0:
        check_writable(config)
    resume_point = find_resume_point(config)
    if resume_point is not None:
        config = adopt_checkpoint_batches(config, resume_point[2], comm.size)
    wall_start = time.perf_counter()
    trainer = Trainer(config, comm)
    if resume_point is not None:
        trainer.resume(resume_point)
    outputs, position = trainer.outputs, trainer.position
    ranks = comm.allgather_object({"rank": comm.rank, "host": socket.gethostname(), "pid": os.getpid()})
    watchdog.arm(comm, config.collective_timeout, config.stall_warning, ranks)
    grid = {"torus_grid": trainer.grid.to_dict()} if trainer.grid else {}
    outputs.start({**config.to_dict(), "environment": environment.record(), **grid}, ranks, position)
    outputs.banner(config, f"{trainer.model.num_parameters():,} parameters",
                   trainer.data.describe(),
                   ranks, resume_point and (resume_point[0], position))
    if trainer.grid:
        outputs.notice(trainer.grid.describe())

    if position.epoch >= config.epochs:
        outputs.notice(f"the run in {outputs.dir} has finished its {config.epochs} epochs: raise --epochs to go on")
        return outputs.finished_summary()

    metrics, path, stopped = {}, None, False
    with StopRequest() as stop:
        while position.epoch < config.epochs and not stopped:
            epoch_start = time.perf_counter()
            if trainer.train_epoch(stop):
                metrics = trainer.finish_epoch(time.perf_counter() - epoch_start)
                metrics["seconds"] = time.perf_counter() - epoch_start
                outputs.epoch(metrics, config.epochs)
                outputs.tuning(kernels.tuning_report())
                path = trainer.save_checkpoint()
                stopped, = trainer.any_rank(stop.requested is not None)
            else:  # asked to stop inside the epoch
                path, stopped = trainer.save_checkpoint(), True
        if trainer.trace is not None:
            trainer.trace.finish()
        if stopped:  # still inside StopRequest: the scheduler's repeated signals stay harmless
            if comm.rank == 0:
                outputs.notice(stopped_line(stop.requested, position.iteration, path, outputs.dir))
            return {"preempted": True, "checkpoint": str(path), "iteration": position.iteration}

    summary = dict(metrics, model=config.model, epochs=config.epochs, world_size=comm.size,
                   global_batch=metrics.get("global_batch"), wall_time=time.perf_counter() - wall_start,
                   output_dir=str(outputs.dir))
    outputs.summary(summary)
    return summary
