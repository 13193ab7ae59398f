"""The weights' refresh: only what changed since the last iteration travels to the replicas.

Every iteration the tasks need the driver's current state (:class:`ParamLayout`'s raw bytes).
A large embedding table trained with an optimizer that only moves the rows its gradient touched
(*row-local*: ``SparseAdam``, ``Adagrad`` and ``SGD`` without momentum or weight decay, on a
``sparse=True`` table) changes in a few thousand rows per iteration, so the refresh of version
``v`` is a **delta**: the changed rows of the row-local tables plus all the other bytes (the dense
rest: layers, buffers, tables under other optimizers). A model without such tables gets the
whole state every iteration, as before.

* Driver: :class:`DriverWeights` keeps the state vector up to date in place, at the cost of the
  rest plus the changed rows (no pass over a table), and knows what changed. With ``bind`` the
  model's parameters (but the row-local tables) are views of the vector, so the optimizer's
  step writes it and the driver holds the weights once (a large model's state would otherwise
  be a second copy of it).
  :class:`RefreshPublisher` broadcasts a **full copy** at the start and whenever the deltas since
  the last full copy would outgrow it (the delta into it is kept as a bridge, so up-to-date
  replicas do not load it), and a delta otherwise; the task gets a :class:`Refresh`: handles
  of the full copy and of every delta since. Each executor's JVM fetches every broadcast a task
  names, once (a new full copy reaches every executor); the Python worker unpickles only those
  it needs (all of them under ``spark.io.encryption.enabled``). A model without row-local
  tables gets a full copy each iteration, destroyed after the job (:meth:`settle`).
* Task: :func:`sync_replica` brings the replica's own copy from its version to ``v``: the deltas
  in order when it holds the full copy's version or a later one, else the full copy first (a new,
  restarted or evicted worker). Each delta carries a chained digest ``H(chain_{v-1}, delta_v)``
  checked before the replica computes, so a replica that missed or misapplied a delta is caught
  (a retry of the task loads the full copy). With ``verify`` (Spark setting
  ``spark.sparkdl.verifyReplicas=true``) the task also hashes its whole model and compares it
  with the hash of the driver's model itself (a pass over the tables: for tests and doubts,
  not for speed). Code that edits a row-local table in the tasks (a functional ``max_norm``, a
  training step writing to the weights) now keeps its edit in the replica: verify catches it.

Example::

    weights = DriverWeights(layout, model, row_local_tables(layout, model, [optimizer]))
    refresh = publisher.publish(weights.current())      # each iteration, after the step:
    weights.advance(model, summed_rows)
"""

from __future__ import annotations

import copy
import hashlib
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from ..errors import ReplicaMismatchError, SparkdlError
from .flat_layout import ParamLayout, raw_bytes
from .table_rows import Rows, row_ids

__all__ = ["row_local_tables", "StateVersion", "Delta", "FullState", "DriverWeights",
           "HeldValue", "RefreshPublisher", "Refresh", "ReplicaState", "sync_replica", "state_digest"]

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- which tables
def _step_hooks(optimizer: torch.optim.Optimizer) -> bool:
    """Whether code of the user's runs around ``optimizer``'s step (its own or global step
    hooks): it may move any row."""
    from torch.optim import optimizer as torch_optimizer

    hooks = [getattr(optimizer, "_optimizer_step_pre_hooks", None),
             getattr(optimizer, "_optimizer_step_post_hooks", None),
             getattr(torch_optimizer, "_global_optimizer_pre_hooks", None),
             getattr(torch_optimizer, "_global_optimizer_post_hooks", None)]
    return any(bool(h) for h in hooks)


def _row_local(optimizer: torch.optim.Optimizer, group: dict[str, Any]) -> bool:
    """Whether ``optimizer``'s step on ``group`` changes only the rows a sparse gradient names
    (torch's own classes, not subclasses: a subclass may do anything; no step hooks)."""
    kind = type(optimizer)
    if _step_hooks(optimizer):
        return False
    if kind is torch.optim.SparseAdam:
        return True
    if kind is torch.optim.Adagrad:
        return not group.get("weight_decay")
    if kind is torch.optim.SGD:
        return not group.get("momentum") and not group.get("weight_decay")
    return False


def row_local_tables(layout: ParamLayout, model: nn.Module,
                     optimizers: Sequence[torch.optim.Optimizer]) -> list[int]:
    """The ``sparse=True`` tables (parameter indices) whose every group in ``optimizers`` (the
    members of an OptimizerSequence, or the one optimizer) is row-local now: after a step, only
    the rows of the summed gradient's ids can differ (and no forward pass changes them: no
    ``max_norm``). Hyperparameters may change between steps: ask before and after each."""
    params = dict(model.named_parameters())
    # a table with max_norm is renormalised in place by the tasks' forward passes: its
    # replicas must be reloaded whole
    renormalised = {id(m.weight) for m in model.modules()
                    if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.max_norm is not None}
    local = []
    for k in layout.sparse:
        p = params[layout.params[k].name]
        if id(p) in renormalised:
            continue
        groups = [(opt, g) for opt in optimizers for g in opt.param_groups
                  if any(q is p for q in g["params"])]
        if all(_row_local(opt, g) for opt, g in groups):
            local.append(k)
    return local


# ----------------------------------------------------------------------------- what travels
@dataclass
class Delta:
    """Version ``version`` from ``version - 1``: the rest's bytes (``rest``, the layout's
    ranges outside the row-local tables, concatenated) and each row-local table's changed rows
    as ``(ids, raw row bytes)``."""

    version: int
    rest: np.ndarray
    rows: dict[int, tuple[np.ndarray, np.ndarray]]

    @property
    def nbytes(self) -> int:
        return self.rest.nbytes + sum(i.nbytes + r.nbytes for i, r in self.rows.values())

    def chained(self, previous: bytes) -> bytes:
        """``H(previous, this delta)``: the chain after applying it."""
        h = hashlib.blake2b(previous, digest_size=16)
        h.update(np.int64(self.version).tobytes())
        h.update(self.rest.tobytes())
        for k in sorted(self.rows):
            ids, rows = self.rows[k]
            h.update(np.int64(k).tobytes())
            h.update(ids.tobytes())
            h.update(rows.tobytes())
        return h.digest()


@dataclass
class FullState:
    """The whole state at ``version``, and the chain a replica starts from."""

    version: int
    state: np.ndarray
    chain: bytes


def full_chain(version: int, fingerprint: str) -> bytes:
    return hashlib.blake2b(f"full {version} {fingerprint}".encode(), digest_size=16).digest()


def state_digest(state: np.ndarray) -> bytes:
    """A digest of a whole state vector (the ``verify`` check)."""
    return hashlib.blake2b(np.ascontiguousarray(state).data, digest_size=16).digest()


@dataclass
class StateVersion:
    """The driver's state at ``version`` (``state``: the whole vector; the caller must not keep
    it past the iteration: it is updated in place) and, when only row-local rows and the rest
    changed since ``version - 1``, how to make that :class:`Delta`."""

    state: np.ndarray
    version: int
    delta: Callable[[], Delta] | None = None
    delta_bytes: int = 0
    row_local: tuple[int, ...] = ()
    fresh: Callable[[], np.ndarray] | None = None   # the whole vector taken anew from the model


def _merged(ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(r for r in ranges if r[1] > r[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(b, out[-1][1]))
        else:
            out.append((a, b))
    return out


def _table_rows_view(state: np.ndarray, layout: ParamLayout, k: int) -> np.ndarray:
    """Table ``k``'s bytes in ``state`` as a (rows, bytes per row) view."""
    slot = layout.params[k]
    return state[slot.byte_start:slot.byte_stop].reshape(slot.shape[0], -1)


class DriverWeights:
    """The driver's state vector, kept current in place (see the module docstring)."""

    def __init__(self, layout: ParamLayout, model: nn.Module, row_local: Sequence[int],
                 version: int = 0, bind: bool = False) -> None:
        self.layout, self.model = layout, model
        self.row_local = sorted(row_local)
        self.rest_ranges = _rest_ranges(layout, set(self.row_local))
        self.rest_bytes = sum(b - a for a, b in self.rest_ranges)
        self.bind = bind
        self.state = layout.state_vector(model)
        # bound: the model's parameters are views of the state (the weights held once)
        self._bound = layout.bind_params(model, self.state, self.row_local) if bind else set()
        self.version = version
        self._changed: dict[int, np.ndarray] | None = None

    def _fresh(self) -> np.ndarray:
        return self.layout.state_vector(self.model)

    def current(self) -> StateVersion:
        changed = self._changed
        if changed is None or not self.row_local:
            return StateVersion(self.state, self.version, row_local=tuple(self.row_local),
                                fresh=self._fresh)
        rows_bytes = sum(len(ids) * (8 + _table_rows_view(self.state, self.layout, k).shape[1])
                         for k, ids in changed.items())
        version, state = self.version, self.state

        def delta() -> Delta:
            rest = np.concatenate([state[a:b] for a, b in self.rest_ranges]) \
                if self.rest_ranges else np.zeros(0, np.uint8)
            rows = {k: (ids, _table_rows_view(state, self.layout, k)[ids].copy())
                    for k, ids in changed.items()}
            return Delta(version, rest, rows)
        return StateVersion(state, version, delta, self.rest_bytes + rows_bytes,
                            tuple(self.row_local), self._fresh)

    def reset(self, model: nn.Module) -> StateVersion:
        """The model changed in ways the deltas cannot say (a closure's trial weights, a
        restore): the whole vector is taken anew and the next refresh is a full copy."""
        self.state = self.layout.state_vector(model)
        if self.bind:
            self._bound = self.layout.bind_params(model, self.state, self.row_local)
        self.version += 1
        self._changed = None
        return self.current()

    def advance(self, model: nn.Module, rows: dict[int, Rows] | None) -> StateVersion:
        """After an optimizer step whose row-local tables got the gradient ``rows``: the rest
        and those rows are copied into the state, in place."""
        tensors = dict(model.named_parameters())
        tensors.update(dict(model.named_buffers()))
        local = set(self.row_local)
        for k, slot in enumerate(self.layout.params):
            if k in local:
                continue
            if k in self._bound and self.layout.bound_in(tensors[slot.name], self.state, k):
                continue                    # a bound one is there already
            self.state[slot.byte_start:slot.byte_stop] = raw_bytes(tensors[slot.name])
            self._bound.discard(k)          # its data was replaced: copied from now on
        for slot in self.layout.buffers:
            self.state[slot.byte_start:slot.byte_stop] = raw_bytes(tensors[slot.name])
        changed = {}
        for k in self.row_local:
            got = (rows or {}).get(k)
            ids = row_ids(got).astype(np.int64) if got is not None else np.zeros(0, np.int64)
            if len(ids):
                table = raw_bytes(tensors[self.layout.params[k].name]).reshape(len(
                    _table_rows_view(self.state, self.layout, k)), -1)
                _table_rows_view(self.state, self.layout, k)[ids] = table[ids]
            changed[k] = ids
        self.version += 1
        self._changed = changed
        return self.current()


@dataclass
class Refresh:
    """What a task gets (small: broadcast handles, versions, chains): see the module docstring.
    ``deltas``: ``(version, chain after it, handle)`` for every delta since the full copy."""

    version: int
    chain: bytes
    full_version: int
    full_chain: bytes
    full: Any
    deltas: list[tuple[int, bytes, Any]] = field(default_factory=list)
    row_local: tuple[int, ...] = ()   # the tables that travel as rows (not in the rest)
    bridge_from: tuple[int, bytes] | None = None   # the version (and chain) before the full
    # copy's, from which its first delta leads to it
    verify: bytes | None = None      # the driver's state_digest, when replicas are verified


class HeldValue:
    """A stand-in for a broadcast in one process (the in-process runner and tests): it holds a
    copy, as a broadcast holds the value's bytes as they were when it was made."""

    def __init__(self, value: Any) -> None:
        self.value = copy.deepcopy(value)

    def destroy(self) -> None:
        self.value = None


class RefreshPublisher:
    """Turns each iteration's :class:`StateVersion` into broadcasts and a :class:`Refresh`.

    ``broadcast(value)`` makes a handle whose ``.value`` a task reads and which has
    ``destroy()``; a full copy is sent when a delta is over half the state, or when the deltas
    since the last full copy would outgrow it (so executors hold at most about twice the
    state)."""

    def __init__(self, broadcast: Callable[[Any], Any], fingerprint: str, deltas: bool = True,
                 verify: bool = False) -> None:
        self._broadcast = broadcast
        self._fingerprint = fingerprint
        self._use_deltas, self._verify = deltas, verify
        self._full: tuple[int, bytes, Any] | None = None    # version, chain, handle
        self._deltas: list[tuple[int, bytes, Any]] = []
        self._delta_total = 0
        self._last: Refresh | None = None
        self.full_copies, self.delta_count, self.full_bytes, self.delta_bytes = 0, 0, 0, 0

    def publish(self, weights: StateVersion) -> Refresh:
        if self._last is not None and self._last.version == weights.version:
            return self._last               # the same iteration again (a recovery's rerun)
        last, full_bytes = self._last, weights.state.nbytes
        small = (self._use_deltas and weights.delta is not None and last is not None
                 and last.version == weights.version - 1 and 2 * weights.delta_bytes <= full_bytes)
        bridge_from = None
        if small and self._full is not None \
                and self._delta_total + weights.delta_bytes <= full_bytes:
            assert last is not None
            chain, size = self._add_delta(weights, last.chain)
            self._delta_total += size
        else:
            # a new full copy; when this version follows the last by a small delta, that delta
            # is kept beside it (a bridge), so replicas of the last version need not load it.
            # The old broadcasts are destroyed once the new ones exist.
            old = self._handles()
            self._deltas, self._delta_total = [], 0
            chain = full_chain(weights.version, self._fingerprint)
            if small:
                assert last is not None
                bridge_from = (last.version, last.chain)
                chain, self._delta_total = self._add_delta(weights, last.chain)
            handle = self._broadcast(FullState(weights.version, weights.state, chain))
            self._full = (weights.version, chain, handle)
            self.full_copies += 1
            self.full_bytes += full_bytes
            for stale in old:
                stale.destroy()
        assert self._full is not None
        verify = None
        if self._verify:         # the driver's model itself, not the state kept from it
            verify = state_digest(weights.fresh() if weights.fresh is not None
                                  else weights.state)
        self._last = Refresh(weights.version, chain, self._full[0], self._full[1], self._full[2],
                             list(self._deltas), weights.row_local, bridge_from, verify)
        return self._last

    def settle(self) -> None:
        """After the iteration's job: a state with no row-local tables never gets a delta, so
        its full copy is destroyed now rather than kept (it may be large, the driver's memory
        small)."""
        if self._last is not None and (not self._use_deltas or not self._last.row_local):
            self.close()

    def _add_delta(self, weights: StateVersion, previous: bytes) -> tuple[bytes, int]:
        assert weights.delta is not None
        delta = weights.delta()
        chain = delta.chained(previous)
        self._deltas.append((weights.version, chain, self._broadcast(delta)))
        self.delta_count += 1
        self.delta_bytes += delta.nbytes
        return chain, delta.nbytes

    def summary(self) -> str:
        return (f"{self.full_copies} full copies ({self.full_bytes / 2**20:.1f} MiB) and "
                f"{self.delta_count} row deltas ({self.delta_bytes / 2**20:.1f} MiB)")

    def _handles(self) -> list[Any]:
        return [h for _, _, h in self._deltas] + ([self._full[2]] if self._full else [])

    def close(self) -> None:
        """Destroy every broadcast; the next refresh is a full copy."""
        for handle in self._handles():
            handle.destroy()
        self._full, self._deltas, self._delta_total, self._last = None, [], 0, None


# ----------------------------------------------------------------------------- task side
@dataclass
class ReplicaState:
    """A replica's own copy of the state, its version and chain; ``model_synced`` False when
    something else (a validation task) loaded other weights into the model."""

    version: int
    chain: bytes
    state: np.ndarray
    model_synced: bool = True


def _load_rows(layout: ParamLayout, param: torch.Tensor, k: int, ids: np.ndarray,
               state: np.ndarray) -> None:
    slot = layout.params[k]
    rows = _table_rows_view(state, layout, k)[ids]
    values = torch.from_numpy(rows).view(slot.dtype).view(len(ids), *slot.shape[1:])
    index = torch.from_numpy(ids)
    with torch.no_grad():
        param.index_copy_(0, index.to(param.device), values.to(param.device))


def sync_replica(replica: Any, refresh: Refresh) -> tuple[np.ndarray, bool]:
    """Bring ``replica`` (its ``model``, ``layout`` and ``refresh_state``) to
    ``refresh.version``: returns the state it now holds and whether it read the full copy."""
    layout, model = replica.layout, replica.model
    held: ReplicaState | None = getattr(replica, "refresh_state", None)
    known = dict([refresh.bridge_from]) if refresh.bridge_from else {}
    known[refresh.full_version] = refresh.full_chain
    known.update({v: c for v, c, _ in refresh.deltas})
    full_read = held is None or known.get(held.version) != held.chain
    if full_read:
        full: FullState = refresh.full.value
        # without row-local tables every refresh is a full copy: the replica neither keeps nor
        # copies it (a copy of the whole state per worker, for nothing, at a model's size)
        held = ReplicaState(full.version, full.chain, np.array(full.state, copy=True)
                            if refresh.row_local else full.state, model_synced=False)
    assert held is not None
    replica.refresh_state = None            # until it is whole again
    pending = [(v, c, h) for v, c, h in refresh.deltas if v > held.version]
    local = set(refresh.row_local)
    rest_ranges = _rest_ranges(layout, local)
    params = dict(model.named_parameters())
    for version, chain, handle in pending:
        delta: Delta = handle.value
        if delta.chained(held.chain) != chain or delta.version != version:
            raise SparkdlError(f"the weights' delta of version {version} does not chain onto "
                               f"this replica's version {held.version}; a retry of this task "
                               "loads the full copy")
        for k, (ids, rows) in delta.rows.items():
            _table_rows_view(held.state, layout, k)[ids] = rows
            if held.model_synced:
                _load_rows(layout, params[layout.params[k].name], k, ids, held.state)
        if delta.rest.nbytes:
            offset = 0
            for a, b in rest_ranges:
                held.state[a:b] = delta.rest[offset:offset + b - a]
                offset += b - a
        held.version, held.chain = version, chain
    if held.chain != refresh.chain:
        raise SparkdlError(f"this replica reached version {held.version}, not the driver's "
                           f"{refresh.version}; a retry of this task loads the full copy")
    # the rest (buffers the last task changed included); the tables' rows are in place
    layout.load_state(model, held.state, skip=local if held.model_synced else ())
    held.model_synced = True
    if refresh.verify is not None and state_digest(layout.state_vector(model)) != refresh.verify:
        raise ReplicaMismatchError(
            f"spark.sparkdl.verifyReplicas: this replica's weights differ from the driver's at "
            f"version {refresh.version} (full copy {refresh.full_version}, "
            f"{len(pending)} deltas applied in this task)")
    replica.refresh_state = held if refresh.row_local else None
    return held.state, full_read


def _rest_ranges(layout: ParamLayout, local: set[int]) -> list[tuple[int, int]]:
    slots = [s for k, s in enumerate(layout.params) if k not in local]
    return _merged([(s.byte_start, s.byte_stop) for s in slots + layout.buffers])
