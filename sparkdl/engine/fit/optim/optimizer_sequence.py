"""Several torch optimizers (and LR schedulers) over disjoint parameter groups, used as one.

The standard recipe for a recommender is one optimizer for the embedding tables, which get
sparse gradients (``SparseAdam``, ``Adagrad``), and another for the dense rest (``Adam``).
:class:`OptimizerSequence` steps its optimizers in order, zeroes them together and checkpoints
them as one state; :class:`SchedulerSequence` does the same for their schedulers. The engine
takes a list of optimizers (``optimizer=[...]``) and of schedulers and wraps them so. Also here,
what the loop asks of any optimizer or scheduler, one or a sequence: its members, whether its
step needs a closure (:func:`needs_closure`) or a metric (:func:`scheduler_needs_metric`).

Example::

    tables = [model.user.weight, model.item.weight]
    optimizer = OptimizerSequence([torch.optim.SparseAdam(tables, lr=0.01),
                                   torch.optim.Adam(model.head.parameters(), lr=0.001)])
    optimizer.step()            # SparseAdam, then Adam
"""

from __future__ import annotations

import inspect
from typing import Any, Sequence

import torch

from ....errors import InvalidArgumentError

__all__ = ["OptimizerSequence", "SchedulerSequence", "as_optimizer", "as_scheduler",
           "optimizer_members", "needs_closure", "scheduler_needs_metric",
           "required_step_arguments"]


def needs_closure(optimizer: Any) -> bool:
    """True for optimizers whose ``step`` requires a closure (``torch.optim.LBFGS``)."""
    closure = inspect.signature(optimizer.step).parameters.get("closure")
    return closure is not None and closure.default is inspect.Parameter.empty


def required_step_arguments(scheduler: Any) -> list[str]:
    """The arguments ``scheduler.step`` cannot be called without."""
    return [name for name, p in inspect.signature(scheduler.step).parameters.items()
            if p.default is inspect.Parameter.empty
            and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def scheduler_needs_metric(scheduler: Any) -> bool:
    """True for LR schedulers whose ``step`` takes a metric (``ReduceLROnPlateau``)."""
    if scheduler is None:
        return False
    if isinstance(scheduler, SchedulerSequence):
        return any(scheduler_needs_metric(s) for s in scheduler.schedulers)
    return (isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
            or bool(required_step_arguments(scheduler)))


def task_scheduler_step(scheduler: Any, step: str) -> str:
    """When the tasks that train whole optimizers (model hopping, local rounds) step
    ``scheduler`` (``step``: the fit's ``lr_scheduler_step``): ``"iteration"``, ``"epoch"``
    (after the iteration or visit that closes an epoch), or ``""`` (none, or a metric scheduler
    stepped per epoch on the driver)."""
    if scheduler is None:
        return ""
    if step == "iteration":
        return "iteration"
    return "" if scheduler_needs_metric(scheduler) else "epoch"


class OptimizerSequence(torch.optim.Optimizer):
    """Torch optimizers over disjoint parameters, stepped in the given order (see the module
    docstring). ``param_groups`` lists every member's groups in order (the same dicts, so a
    change of ``lr`` there reaches the member); ``state_dict`` holds each member's state."""

    def __init__(self, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        # no Optimizer.__init__: the members hold the parameters, their state and their hooks
        self.optimizers = list(optimizers)
        seen: dict[int, int] = {}
        for k, opt in enumerate(self.optimizers):
            if not isinstance(opt, torch.optim.Optimizer) or isinstance(opt, OptimizerSequence):
                raise InvalidArgumentError(
                    f"optimizer[{k}] must be a torch.optim.Optimizer; got {type(opt).__name__}.")
            for group in opt.param_groups:
                for p in group["params"]:
                    if id(p) in seen and seen[id(p)] != k:
                        raise InvalidArgumentError(
                            f"optimizer[{seen[id(p)]}] and optimizer[{k}] both hold a parameter "
                            f"of shape {tuple(p.shape)}: the optimizers of a sequence must hold "
                            "disjoint parameters.")
                    seen[id(p)] = k
        if not self.optimizers:
            raise InvalidArgumentError("optimizer: an empty sequence of optimizers.")
        for k, opt in enumerate(self.optimizers):
            if needs_closure(opt):
                raise InvalidArgumentError(
                    f"optimizer[{k}] ({type(opt).__name__}) needs a closure at every step: it "
                    "cannot be one of several optimizers. Train it alone.")
        self.defaults = dict(self.optimizers[0].defaults)

    @property
    def param_groups(self) -> list[dict[str, Any]]:      # type: ignore[override]
        return [group for opt in self.optimizers for group in opt.param_groups]

    @property
    def state(self) -> dict[Any, Any]:                    # type: ignore[override]
        return {p: s for opt in self.optimizers for p, s in opt.state.items()}

    def step(self, closure: Any = None) -> Any:           # type: ignore[override]
        """Step every optimizer, in order (a closure is evaluated once, by the first)."""
        loss = None
        for k, opt in enumerate(self.optimizers):
            loss = opt.step(closure) if closure is not None and k == 0 else opt.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:               # type: ignore[override]
        return {"optimizers": [opt.state_dict() for opt in self.optimizers]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:   # type: ignore[override]
        states = state_dict.get("optimizers") if isinstance(state_dict, dict) else None
        if states is None or len(states) != len(self.optimizers):
            raise InvalidArgumentError(
                f"The optimizer state holds {len(states) if states is not None else 'no'} "
                f"optimizers' states; this sequence has {len(self.optimizers)} optimizers.")
        for opt, state in zip(self.optimizers, states):
            opt.load_state_dict(state)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        raise InvalidArgumentError("Add the parameter group to one optimizer of the sequence.")

    def __getstate__(self) -> dict[str, Any]:
        return {"optimizers": self.optimizers, "defaults": self.defaults}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"OptimizerSequence({', '.join(type(o).__name__ for o in self.optimizers)})"


class SchedulerSequence:
    """LR schedulers of an :class:`OptimizerSequence`'s members, stepped in order; a metric
    (``ReduceLROnPlateau``) goes to the schedulers whose ``step`` takes one."""

    def __init__(self, schedulers: Sequence[Any], optimizer: OptimizerSequence) -> None:
        self.schedulers = list(schedulers)
        self.optimizer = optimizer
        members = {id(o): k for k, o in enumerate(optimizer.optimizers)}
        for k, scheduler in enumerate(self.schedulers):
            if id(getattr(scheduler, "optimizer", None)) not in members:
                raise InvalidArgumentError(
                    f"lr_scheduler[{k}] ({type(scheduler).__name__}) must be built over one of "
                    "the optimizers of the optimizer sequence.")

    def step(self, metric: Any = None) -> None:
        for scheduler in self.schedulers:
            if scheduler_needs_metric(scheduler):
                scheduler.step(metric)
            else:
                scheduler.step()

    def state_dict(self) -> dict[str, Any]:
        return {"schedulers": [s.state_dict() for s in self.schedulers]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        states = state_dict.get("schedulers") if isinstance(state_dict, dict) else None
        if states is None or len(states) != len(self.schedulers):
            raise InvalidArgumentError(
                "The LR scheduler state does not hold one state per scheduler of the sequence "
                f"({len(self.schedulers)}).")
        for scheduler, state in zip(self.schedulers, states):
            scheduler.load_state_dict(state)

    def get_last_lr(self) -> list[float]:
        return [lr for s in self.schedulers for lr in s.get_last_lr()]

    def __repr__(self) -> str:
        return f"SchedulerSequence({', '.join(type(s).__name__ for s in self.schedulers)})"


def optimizer_members(optimizer: Any) -> list[torch.optim.Optimizer]:
    """The optimizers an :class:`OptimizerSequence` steps, or ``[optimizer]``."""
    if isinstance(optimizer, OptimizerSequence):
        return list(optimizer.optimizers)
    return [optimizer]


def as_optimizer(optimizer: Any) -> Any:
    """``optimizer``, or an :class:`OptimizerSequence` of a list or tuple of optimizers (one
    alone is itself)."""
    if isinstance(optimizer, (list, tuple)):
        return optimizer[0] if len(optimizer) == 1 else OptimizerSequence(optimizer)
    return optimizer


def as_scheduler(scheduler: Any, optimizer: Any) -> Any:
    """``scheduler``, or a :class:`SchedulerSequence` of a list or tuple of schedulers over the
    members of ``optimizer`` (an :class:`OptimizerSequence`)."""
    if not isinstance(scheduler, (list, tuple)):
        return scheduler
    if not scheduler:
        return None
    if not isinstance(optimizer, OptimizerSequence):
        if len(scheduler) == 1:
            return scheduler[0]
        raise InvalidArgumentError("lr_scheduler: several schedulers need several optimizers "
                                   "(optimizer=[...]), one scheduler per optimizer at most.")
    return SchedulerSequence(scheduler, optimizer)
