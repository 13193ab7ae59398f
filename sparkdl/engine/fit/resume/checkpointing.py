"""Checkpoints of a run and resuming from them (driver side).

A checkpoint holds the model, optimizer and scheduler states, the iteration and epoch, torch's
RNG state and the number of summary records so far; the records themselves go to parts beside
it, each with the records since the previous checkpoint and named by its content hash
(``summary-<iteration>-<hash>.pt``), and the checkpoint lists the parts it needs. A stop at any
point leaves either a committed checkpoint with every part it lists, or the previous one; parts
no checkpoint lists are never read and are removed; a committed file is never rewritten; a
resume checks that its history is every iteration once, in order
(:class:`sparkdl.storage.checkpoint_store.CheckpointStore` writes each file atomically). Resuming checks, before any cluster work, that the newest checkpoint
belongs to this model (class and parameter shapes), and, once the data is known, that it was
written by a run with the same seed, batch size, shuffling and partition sizes: only then does
the resumed run reproduce the interrupted one bitwise.

A model of a :class:`~sparkdl.adapters.PretrainedModel` keeps its frozen base on the meta device
on the driver: its checkpoints hold the tensors the driver holds (:func:`held_state`: the
trainable ones and the buffers) and the base by reference (``pretrained_base``: its path and
content identity, checked on resume), never the base's weights.

Example::

    checkpoints = Checkpoints(CheckpointSetup(path, EveryEpoch(), 3, True), store)
    state = checkpoints.latest(model)          # None, or the newest checkpoint's state
    checkpoints.restore(ctx, state)            # after the plan is known
    checkpoints.write(ctx)                     # whenever the trigger fires
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from ....errors import CheckpointError
from ....executor.replicas import load_non_persistent_buffers, non_persistent_buffers
from ....storage.checkpoint_store import FORMAT_VERSION, CheckpointStore
from ....triggers import Trigger, planned_iterations
from ..run_context import KEY_DEFAULTS, RunContext
from ..reports.summary import IterationRecord, TrainingSummary, ValidationRecord
from .numeric_platform import numeric_platform, platform_differences

__all__ = ["CheckpointSetup", "Checkpoints", "shown", "held_state", "load_held_state"]

log = logging.getLogger("sparkdl")


@dataclass(frozen=True)
class CheckpointSetup:
    """What :meth:`sparkdl.DistriOptimizer.set_checkpoint` asked for."""

    path: str
    trigger: Trigger
    keep_last: int
    resume: bool
    by_fit: bool = False      # each fit in its own subdirectory, named by its resume key


def shown(value: Any) -> str:
    """``value`` as an error message shows it (at most 300 characters)."""
    text = str(value) if isinstance(value, (str, int, float, bool)) or value is None else \
        repr(value)
    return text if len(text) <= 300 else text[:300] + "..."


def _model_class(model: nn.Module) -> str:
    return f"{type(model).__module__}.{type(model).__qualname__}"


def held_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s ``state_dict`` as copies, without the tensors on the meta device (a
    pretrained model's frozen base, which the driver does not hold)."""
    return {k: v.detach().clone() for k, v in model.state_dict().items() if not v.is_meta}


def load_held_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load a :func:`held_state` into ``model``: every tensor it holds off the meta device must
    be in ``state``."""
    ours = {k for k, v in model.state_dict().items() if not v.is_meta}
    if set(state) != ours:
        missing, extra = sorted(ours - set(state)), sorted(set(state) - ours)
        raise CheckpointError(f"The saved state does not fit this model: it lacks {missing[:3]} "
                              f"and has {extra[:3]} that the model does not hold.")
    model.load_state_dict(state, strict=len(ours) == len(model.state_dict()))


def _base_reference(model: nn.Module) -> dict[str, str] | None:
    """The pretrained base of ``model`` by path and content identity, or None."""
    from ....adapters.pretrained import pretrained_origin

    origin = pretrained_origin(model)
    if origin is None:
        return None
    return {"path": origin[0].path, "identity": origin[0].identity()}


def _model_signature(model: nn.Module) -> list[list[Any]]:
    return [[name, list(t.shape)] for name, t in model.state_dict().items()]


class Checkpoints:
    """Writes a run's checkpoints to ``store`` and resumes from them."""

    def __init__(self, setup: CheckpointSetup, store: CheckpointStore) -> None:
        self.setup = setup
        self.store = store
        self._summary_written = (0, 0)   # records already in summary parts
        self._parts: list[str] = []          # those parts' names, in order

    def latest(self, model: nn.Module) -> dict[str, Any] | None:
        """The newest checkpoint to resume from, checked against ``model`` (no cluster work)."""
        if not self.setup.resume:
            return None
        iterations = self.store.iterations()
        if not iterations:
            return None
        state = self.store.read(iterations[-1])
        name = self.store.file_name(iterations[-1])
        if "summary_parts" in state:        # what a stopped writer left is nobody's
            self.store.remove_strays(list(state["summary_parts"]))
        if state.get("model_class") != _model_class(model):
            raise CheckpointError(f"The checkpoint {name} is of a model of class "
                                  f"{state.get('model_class')}, not {_model_class(model)}.")
        theirs = state.get("model_signature", [])
        ours = _model_signature(model)
        if theirs != ours:
            diff = next(((a, b) for a, b in zip(theirs, ours) if a != b),
                        (theirs[len(ours):len(ours) + 1] or ["(none)"],
                         ours[len(theirs):len(theirs) + 1] or ["(none)"]))
            raise CheckpointError(f"The checkpoint {name} belongs to a different model: it has "
                                  f"{diff[0]} where this model has {diff[1]}.")
        return state

    def restore(self, ctx: RunContext, state: dict[str, Any]) -> None:
        """Put ``state`` into the run, after checking that it was written by the same kind of
        run (seed, batch size, shuffling, partition sizes)."""
        name = self.store.file_name(int(state["iteration"]))
        ours = ctx.resume_key()
        if "identity_version" not in state["run"]:
            # written before identities were derived from content: its hyperparameters and
            # weights were recorded another way, only the data and the settings compare
            comparable = (set(ctx.settings.reproducibility_key(ctx.plan)) | set(ctx.strategy_key)
                          | {"data"})
            log.warning("the checkpoint %s predates fit identities derived from content: only "
                        "its data and %s are verified before resuming it", name,
                        ", ".join(sorted(comparable - {"data"})))
        else:
            comparable = set(ours)
        unknown = [key for key in ours if key in comparable and key not in state["run"]
                   and key not in KEY_DEFAULTS]
        if unknown:
            log.warning("the checkpoint %s predates the checks of %s: resuming it without "
                        "them", name, ", ".join(unknown))
        for key, value in ours.items():
            if key in unknown or key not in comparable:
                continue
            theirs = state["run"].get(key, KEY_DEFAULTS.get(key))
            if theirs != value:
                raise CheckpointError(
                    f"The checkpoint {name} belongs to another fit: it was written by a run with "
                    f"{key}={shown(theirs)}, but this run has {key}={shown(value)}. Resuming "
                    "it would not continue this fit. Use a new checkpoint directory (or "
                    "set_checkpoint(..., by_fit=True): one subdirectory per fit), or the same "
                    "data, hyperparameters and initial weights.")
        if "strategy" in state["run"] and "strategy" not in ours:
            raise CheckpointError(
                f"The checkpoint {name} was written by a fit trained by "
                + ("local rounds" if "local_steps" in state["run"] else "model hopping")
                + f" ({state['run']['strategy']}); this fit trains synchronously data-parallel: "
                "resuming it would not continue this fit. Use another checkpoint directory (or "
                "by_fit=True).")
        planned = planned_iterations(ctx.end_trigger, ctx.plan.iterations_per_epoch)
        if planned is not None and int(state["iteration"]) > planned:
            raise CheckpointError(
                f"The checkpoint {name} is at iteration {state['iteration']}, past this run's "
                f"end at iteration {planned}: it was written by a longer run of the same fit "
                "(training longer resumes, training shorter cannot go back). Use another "
                "checkpoint directory for the shorter run.")
        base = state.get("pretrained_base")
        if base is not None:
            ours_base = _base_reference(ctx.model)
            if ours_base is None or ours_base["identity"] != base["identity"]:
                raise CheckpointError(
                    f"The checkpoint {name} was written by a fit of the pretrained base at "
                    f"{base['path']!r} (identity {base['identity'][:16]}...); this fit's base "
                    f"is {ours_base}. Resume with the same base, or use another checkpoint "
                    "directory.")
        load_held_state(ctx.model, state["model_state"])
        load_non_persistent_buffers(ctx.model, state.get("other_buffers", {}))
        ctx.optimizer.load_state_dict(state["optimizer_state"])
        if ctx.lr_scheduler is not None and state.get("scheduler_state") is not None:
            ctx.lr_scheduler.load_state_dict(state["scheduler_state"])
        torch.set_rng_state(state["torch_rng_state"])
        for trigger, trigger_state in zip(ctx.end_trigger.walk(), state.get("triggers", [])):
            trigger.load_state_dict(trigger_state)
        ctx.best_states = {int(k): v for k, v in state.get("best_states", {}).items()}
        if ctx.loss_scaler is not None and state.get("loss_scaler") is not None:
            ctx.loss_scaler.load_state_dict(state["loss_scaler"])
        ctx.resumed_strategy_state = state.get("strategy_state")
        ctx.iteration = int(state["iteration"])
        if "summary" in state:       # written before the summary moved beside the checkpoint
            iterations, validations = (state["summary"]["iterations"],
                                       state["summary"]["validations"])
            self._parts = []
        else:
            count_i, count_v = state["summary_records"]
            if "summary_parts" in state:
                self._parts = list(state["summary_parts"])
                parts = self.store.read_summary_parts(self._parts)
            else:                    # parts named by iteration only: chosen by number
                self._parts = []
                parts = self.store.read_legacy_summary_parts(int(state["iteration"]))
            iterations = [r for p in parts for r in p["iterations"]][:count_i]
            validations = [v for p in parts for v in p["validations"]][:count_v]
            if len(iterations) != count_i or len(validations) != count_v:
                raise CheckpointError(f"The summary parts beside {name} hold {len(iterations)} "
                                      f"iteration records, the checkpoint needs {count_i}: "
                                      "some summary-*.pt files are missing.")
        _check_continuous(name, int(state["iteration"]), iterations, validations)
        ctx.summary = TrainingSummary([IterationRecord(**r) for r in iterations],
                                      [ValidationRecord(**v) for v in validations])
        # a checkpoint whose records are not in named parts: the next one writes them all
        self._summary_written = ((len(iterations), len(validations)) if self._parts
                                 else (0, 0))
        log.warning("resuming from checkpoint %s: iteration %d, epoch %d", name, ctx.iteration,
                    ctx.iteration // ctx.plan.iterations_per_epoch)
        _note_platform(name, state.get("platform"))

    def write(self, ctx: RunContext) -> str:
        """Write the run's whole state now; returns the checkpoint's path. The summary records
        since the previous checkpoint go first, to a part named by its content hash; the
        checkpoint lists every part it needs, so a part that a stop left without its checkpoint
        is never read (and is removed). A checkpoint of an iteration already committed (the NaN
        stop right after a regular checkpoint) is not written again."""
        if ctx.iteration in self.store.iterations():
            return self.store.file_name(ctx.iteration)
        done_i, done_v = self._summary_written
        part = self.store.write_summary_part(ctx.iteration, {
            "iterations": [asdict(r) for r in ctx.summary.iterations[done_i:]],
            "validations": [asdict(v) for v in ctx.summary.validations[done_v:]]})
        parts = self._parts + [part]
        state = {
            "format_version": FORMAT_VERSION,
            "model_class": _model_class(ctx.model),
            "model_signature": _model_signature(ctx.model),
            "model_state": held_state(ctx.model),
            "pretrained_base": _base_reference(ctx.model),
            "other_buffers": non_persistent_buffers(ctx.model),
            "optimizer_state": ctx.optimizer.state_dict(),
            "scheduler_state": (ctx.lr_scheduler.state_dict()
                                if ctx.lr_scheduler is not None else None),
            "iteration": ctx.iteration,
            "epoch": ctx.iteration // ctx.plan.iterations_per_epoch,
            "run": ctx.resume_key(),
            "torch_rng_state": torch.get_rng_state(),
            "platform": numeric_platform(),
            "triggers": [t.state_dict() for t in ctx.end_trigger.walk()],
            "best_states": {str(k): v for k, v in ctx.best_states.items()},
            "loss_scaler": (ctx.loss_scaler.state_dict() if ctx.loss_scaler is not None
                            else None),
            "strategy_state": (ctx.strategy_state.state_dict()
                               if ctx.strategy_state is not None else None),
            # the summary: the records' count and the parts that hold them, in order
            "summary_records": [len(ctx.summary.iterations), len(ctx.summary.validations)],
            "summary_parts": parts,
        }
        path = self.store.write(ctx.iteration, state, self.setup.keep_last)
        self._parts = parts
        self._summary_written = (len(ctx.summary.iterations), len(ctx.summary.validations))
        self.store.remove_strays(parts)
        log.info("checkpoint written: %s", path)
        return path


def _note_platform(name: str, recorded: dict[str, str] | None) -> None:
    """Say when the checkpoint's writer rounded on another platform than this driver
    (:mod:`sparkdl.engine.fit.resume.numeric_platform`): the fit continues from the
    checkpoint's weights exactly, but the iterations from here on round as this platform does."""
    if recorded is None:
        log.info("the checkpoint %s does not record the platform it was written on (an earlier "
                 "sparkdl wrote it): if that was other hardware or another torch, the weights "
                 "from here on can differ in their last bits from a fit trained on one platform "
                 "throughout", name)
        return
    differences = platform_differences(recorded, numeric_platform())
    if differences:
        log.warning("the checkpoint %s was written on another numeric platform: %s. The fit "
                    "continues from its weights exactly, but this platform's kernels round "
                    "differently, so the weights from here on can differ in their last bits "
                    "from a fit trained on either platform throughout", name,
                    "; ".join(differences))


def _check_continuous(name: str, iteration: int, iterations: list[dict[str, Any]],
                      validations: list[dict[str, Any]]) -> None:
    """A resumed history must be every iteration from 1 to the checkpoint's, once and in order,
    and validations after iterations of it in order: anything else was spliced."""
    numbers = [int(r["iteration"]) for r in iterations]
    if numbers != list(range(1, iteration + 1)):
        where = next((i for i, n in enumerate(numbers) if n != i + 1), len(numbers))
        raise CheckpointError(
            f"The training history beside {name} is not continuous: its iteration records read "
            f"{numbers[max(0, where - 2):where + 3]} around record {where + 1} (expected "
            f"1..{iteration} once each). Resuming would splice another run's records in; delete "
            "the directory to start over.")
    after = [int(v["iteration"]) for v in validations]
    if after != sorted(after) or any(not 0 <= n <= iteration for n in after):
        raise CheckpointError(f"The validation history beside {name} is not continuous "
                              f"(validations after iterations {after[:10]}...); delete the "
                              "directory to start over.")
