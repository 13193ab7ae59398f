"""What makes two fits the same fit, for checkpoints (driver side).

A checkpoint may only be resumed by the fit that wrote it. The identity of a fit is derived from
everything that decides its result, not from a list of knobs someone remembered:

* every argument of :class:`sparkdl.DistriOptimizer` (read back from the object as it is when
  :meth:`~sparkdl.DistriOptimizer.optimize` starts, so ``opt.batch_size = 64`` counts), except
  those named in :data:`NOT_IN_IDENTITY` with the reason they cannot change the weights;
* the state every setter left (clipping; validation wherever it decides anything: an
  EarlyStopping end trigger or a scheduler stepped on a metric), except the setters in
  :data:`NOT_IN_IDENTITY`;
* objects by their content (:mod:`sparkdl.engine.fit.resume.content_digest`): the model's class,
  attributes, hooks and initial weights, the criterion's settings, functions' code and closure
  values, the optimizer's class, hyperparameters and state, the schedulers' lambdas and state;
* the training data's (and, where validation decides, the validation data's) content hashes;
* what the caller adds (the estimators add their Params, :func:`params_identity`).

An object that cannot be hashed deterministically is refused (:class:`UnidentifiableError`)
unless the fit has an explicit name (:meth:`sparkdl.DistriOptimizer.set_fit_identity`), which
then stands for the whole argument that reached it. All of this is computed only for fits that write checkpoints.

Example::

    identity = fit_identity(opt)                             # at the start of optimize()
    identity["data"] = data_digest(train.summaries)          # once the shards are built
    subdirectory = identity_directory(identity)               # "fit-3f2a...": one per fit
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping, Sequence

from ....triggers import EarlyStopping
from ....errors import UnidentifiableError
from .content_digest import content_digest
from ..spec import ARGUMENTS, Fit, fit_of
from ..optim.optimizer_sequence import OptimizerSequence, optimizer_members, scheduler_needs_metric

__all__ = ["fit_identity", "data_digest", "identity_directory", "params_identity",
           "NOT_IN_IDENTITY", "PARAMS_NOT_IN_IDENTITY", "SETTER_STATE", "IDENTITY_VERSION",
           "UnidentifiableError"]

NOT_IN_IDENTITY: dict[str, str] = {
    "training_rdd": "identified by its shards' sample counts and content hashes ('data')",
    "end_trigger": "training longer resumes; the EarlyStopping triggers inside it are in the "
                   "identity ('early_stopping': they decide which weights a fit returns)",
    "progress_bar": "display only",
    "allreduce": "every AllReduce path sums the same vectors in partition order: bitwise the "
                 "same weights (tests/test_allreduce_paths.py)",
    "num_blocks": "the reducers add element by element in partition order whatever the blocks: "
                  "bitwise the same weights (tests/test_allreduce_paths.py)",
    "exchange_dir": "where the Connect runner's weights travel, not what they are",
    "local_steps": "in the resume key through the local rounds strategy (with the outer "
                   "optimizer and the warm-up); a synchronous fit has none of them",
    "outer_optimizer": "in the resume key through the local rounds strategy",
    "sync_warmup": "in the resume key through the local rounds strategy",
    "set_checkpoint": "where and when checkpoints are written",
    "set_tensorboard": "reporting only",
    "set_mlflow": "reporting only",
}
"""The arguments and setters of DistriOptimizer that do not decide a fit's weights, and why."""

SETTER_STATE: dict[str, str] = {
    "set_gradient_clipping": "clipping",
    "set_constant_gradient_clipping": "clipping",
    "set_validation": "validation",
    "set_fit_identity": "fit_identity",
}
"""Each setter in the identity, and the key its state is found under."""

PARAMS_NOT_IN_IDENTITY: dict[str, str] = {
    "predictionCol": "transform only", "probabilityCol": "transform only",
    "rawPredictionCol": "transform only", "inferenceBatchSize": "transform only",
    "progressBar": "display only", "tensorboardDir": "reporting only",
    "mlflowLogging": "reporting only", "checkpointDir": "where checkpoints are written",
    "exchangeDir": "where the Connect runner's weights travel, not what they are",
    "localSteps": "in the resume key through the local rounds strategy (H, the outer "
                  "optimizer and the warm-up)",
    "outerOptimizer": "in the resume key through the local rounds strategy",
    "syncWarmup": "in the resume key through the local rounds strategy",
    "tuningStrategy": "fit ignores it; a fit of fitMultiple trained by hopping carries its "
                      "strategy, hop seed and position in its resume key",
}
"""The estimators' Params that do not decide a fit's weights, and why."""

def _plain(value: Any) -> Any:
    """Simple values as they are (readable in errors); anything else as its content digest."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)) and all(
            v is None or isinstance(v, (bool, int, float, str)) for v in value):
        return list(value)
    raise TypeError


def _rendered(value: Any, what: str, named: bool) -> Any:
    """``value`` for the identity. What cannot be hashed is refused, unless the fit is named:
    then the whole of ``what`` stands as named (an unhashable part may sit beside values that
    change from process to process, a pool's threads or a session's ids)."""
    try:
        return _plain(value)
    except TypeError:
        pass
    try:
        return "sha256:" + content_digest(value, what)[:32]
    except UnidentifiableError:
        if named:
            return f"named: {what}"
        raise


def current_argument(opt: Fit, name: str) -> Any:
    """The value of ``DistriOptimizer`` argument ``name`` as the fit holds it now."""
    for holder in (opt, opt.settings, opt.settings.runner_options):
        if hasattr(holder, name):
            return getattr(holder, name)
    raise AttributeError(f"DistriOptimizer keeps no value for its argument {name!r}: add it to "
                         "sparkdl.engine.fit.resume.fit_identity.NOT_IN_IDENTITY with the reason "
                         "it cannot change the weights, or keep it as an attribute")


def _optimizer(optimizer: Any, model: Any, named: bool) -> dict[str, Any]:
    """The optimizer's classes (with their code, for the user's own), its groups'
    hyperparameters and which parameters (by name) each group holds, and its state."""
    names = {id(p): n for n, p in model.named_parameters()}
    groups = [{k: _rendered(v, f"optimizer param_groups[{i}][{k!r}]", named)
               for k, v in sorted(group.items()) if k != "params"}
              | {"params": [names.get(id(p), "?") for p in group["params"]]}
              for i, group in enumerate(optimizer.param_groups)]
    members = optimizer_members(optimizer)
    return {"class": ([type(o).__qualname__ for o in members]
                      if isinstance(optimizer, OptimizerSequence)
                      else type(optimizer).__qualname__),
            "code": _rendered([type(o) for o in members], "the optimizer's class", named),
            "groups": groups,
            "state": _rendered([o.state_dict()["state"] for o in members], "optimizer state",
                               named)}


IDENTITY_VERSION = 2
"""Checkpoints whose key lacks it predate identities derived from content: only their data and
reproducibility settings can be compared
(:meth:`sparkdl.engine.fit.resume.checkpointing.Checkpoints.restore`)."""


def validation_decides(fit: Fit) -> bool:
    """Whether validation can change the weights: an end trigger reads its metrics (early
    stopping, restore-best) or the scheduler steps on a metric (ReduceLROnPlateau)."""
    return fit.validation is not None and (bool(fit.end_trigger.metric_names())
                                           or scheduler_needs_metric(fit.lr_scheduler))


def fit_identity(fit: Any) -> dict[str, Any]:
    """The identity of ``fit`` (a :class:`~sparkdl.engine.fit.spec.Fit`, or the
    :class:`~sparkdl.DistriOptimizer` that holds one) as it is now, without the data (see the
    module docstring). Raises :class:`UnidentifiableError` for an object that cannot be hashed,
    unless the fit has an explicit name."""
    opt = fit_of(fit)
    if opt is None:
        raise TypeError(f"fit_identity takes a Fit or a DistriOptimizer; got {type(fit)!r}")
    name = opt.name
    named = name is not None
    identity: dict[str, Any] = {"identity_version": IDENTITY_VERSION}
    for argument in ARGUMENTS:
        if argument in NOT_IN_IDENTITY:
            continue
        value = current_argument(opt, argument)
        identity[argument] = (_optimizer(value, opt.model, named) if argument == "optimizer"
                              else _rendered(value, argument, named))
    identity["early_stopping"] = [
        _rendered(t, "the end trigger's EarlyStopping", named)
        for t in opt.end_trigger.walk() if isinstance(t, EarlyStopping)]
    clipping = opt.clipping
    identity["clipping"] = None if clipping is None else {
        k: getattr(clipping, k) for k in ("max_norm", "norm_type", "min_value", "max_value")}
    validation = opt.validation
    identity["validation"] = None
    if validation_decides(opt):
        identity["validation"] = {
            "trigger": _rendered(validation.trigger, "the validation trigger", named),
            "metrics": _rendered(validation.metrics, "the validation metrics", named),
            "batch_size": validation.batch_size}
    identity["fit_identity"] = name
    extra = opt.identity_extra
    if extra:
        identity["caller"] = {k: _rendered(v, k, named) for k, v in sorted(extra.items())}
    return identity


def params_identity(stage: Any, objects: Mapping[str, Any]) -> dict[str, Any]:
    """What an estimator adds to its engine's identity: its class, every Param's value but
    those in :data:`PARAMS_NOT_IN_IDENTITY`, and ``objects`` (its factories) by content."""
    values: dict[str, Any] = {"class": f"{type(stage).__module__}.{type(stage).__qualname__}"}
    for param in sorted(stage.params, key=lambda p: p.name):
        if param.name not in PARAMS_NOT_IN_IDENTITY:
            values[f"Param {param.name}"] = stage.getOrDefault(param)
    values.update(objects)
    return values


def data_digest(summaries: Sequence[Any]) -> str:
    """One hash of every partition's sample count and content hash, in partition order."""
    digest = hashlib.sha256()
    for s in sorted(summaries, key=lambda s: s.partition):
        digest.update(f"{s.partition}:{s.count}:{s.content_hash};".encode())
    return digest.hexdigest()


def identity_directory(key: dict[str, Any]) -> str:
    """The subdirectory of a checkpoint directory that belongs to the fit with ``key`` (the
    whole resume key): ``fit-<16 hex digits>``."""
    return "fit-" + content_digest(key, "the fit's key")[:16]
