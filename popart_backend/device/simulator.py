"""The simulated device: executes a ``Program`` with host step IO.

Created at ``prepareDevice()`` without storage; built once, at the first ``weightsFromHost``
or run (never on an offline device): the execution plan (DESIGN decision 9) with every
replica's variables and, per micro-batch of a run, the list of anchor writes it performs, so
``run()`` is a loop over micro-batches that binds input chunks to slots, executes the plan and
copies anchor values into host arrays.

Micro-batch ``k = (b·af + a)·rf + r`` runs batch b, accumulation step a on local replica r; it
reads chunk k of every input array. Replicas are real (DESIGN decision 6): each has
its own slots and variables (``ExecutionPlan.add_replicas``) and they run in lockstep, every
replica's micro-batch (b, a) before the next, so a collective (the gradient all-reduce) reads
all of them; replicas of other processes join through ``device/distributed.py``.

Training: after the last micro-batch of each accumulation window (a = af − 1, all replicas)
the plan's accumulate outer fragment runs (optimizer step, accumulator reset). Before every
micro-batch the device writes the random-seed variable (user seed, micro-batch counter), so
seeded ops draw new values each micro-batch and replay them after ``set_seed``.

Pipelined programs (DESIGN decision 7) run the cycle schedule literally: per
window (one weight update with accumulation, else the whole step), all replicas in lockstep, cycle c of
``G + P - 1`` runs, in stage order, every stage s with ``s <= c < s + G`` on micro-batch
``c - s`` (its host inputs first, its anchors after), then the stages' inter-IPU copies,
highest stage first so each copy reads the value of the previous cycle, as the parallel
hardware exchange does. Without accumulation each backward stage updates its weights as it
runs, so in-flight micro-batches see stale weights exactly as on the hardware.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from .. import progress
from ..dataflow import PyStepIO, PyStepIOCallback
from ..dtypes import DataType, to_host
from ..errors import StepIOError, popart_exception, popart_internal_exception
from .distributed import LocalReplicas, ReplicaComm
from .grouped_weights import GroupedWeights
from .lower import Program
from .plan import DeviceMode, ExecutionPlan, StateSnapshot, to_torch
from .run_tables import ACC_ADD, ACC_FLUSH, ACC_SET, COPY, anchor_actions
from .stream_io import (
    HandOver,
    bind_inputs,
    bind_outputs,
    bind_tensor_inputs,
    callback_feed,
    callback_input,
    callback_output,
    tensor_input_table,
    zeros_of,
)
from .update_tail import UpdateTail

_log = logging.getLogger("popart:devicex")

# Anchor write kinds, per micro-batch (run_tables.py).
_COPY, _ACC_SET, _ACC_ADD, _ACC_FLUSH = COPY, ACC_SET, ACC_ADD, ACC_FLUSH


class SimulatedDevice(GroupedWeights):
    """One compiled Program, ready to run. ``synthetic`` is 'off', 'zeros', 'random_normal'
    or 'random_uniform'.

    ``comm`` (a ``device.distributed.ReplicaComm``) says how the local replicas reach the
    replicas of other processes; default: all replicas are local.
    """

    def __init__(self, program: Program, synthetic: str = "off", seed: int = 0,
                 comm: ReplicaComm | None = None):
        self.program = program
        self.synthetic = synthetic
        rf = program.replication_factor
        self.comm = comm if comm is not None else LocalReplicas(rf)
        if self.comm.local != rf:
            raise popart_internal_exception(
                f"SimulatedDevice: the program has {rf} local replicas, its ReplicaComm "
                f"{self.comm.local}."
            )
        self._sharded = program.graph.ir.sharded_variables if program.graph.ir else {}
        # Ops that need facts about the device running them (custom ops: replica count).
        for op in program.schedule:
            op.bind_program(program)
        self._generator = torch.Generator()
        self._generator.manual_seed(seed)
        # The RNG state (see rng_state): micro-batch k of the next run on local replica r
        # draws with seed _replica_seeds[r] and counter _micro_batch_counter + k + offset r.
        self._micro_batch_counter = 0
        self._replica_seeds = [seed] * rf
        self._counter_offsets = [0] * rf
        # No tensor storage yet: the plan, every replica's variables and the run tables are
        # built by _allocate() on the first use of one of _STORAGE (weightsFromHost, run).
        self._allocated = False
        self.set_seed(seed)
        self._execute = self._execute_replicas  # run() swaps in a counting one for bars

    # The attributes that hold (or index) device storage, built by _allocate() when first read.
    _STORAGE = frozenset({"plan", "_input_slots", "_zero_inputs", "_actions", "_accumulators",
                          "_outer_steps", "_window_end", "_seeds", "_state",
                          "_own_slots", "_tail", "_tensor_inputs"})

    def __getattr__(self, name: str):
        # Only called for attributes not set yet: the storage ones before _allocate().
        if name in SimulatedDevice._STORAGE and self.__dict__.get("_allocated") is False:
            self._allocate()
            return getattr(self, name)
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    @property
    def allocated(self) -> bool:
        """Whether the device holds tensor storage (variables, constants, run buffers)."""
        return self._allocated

    def _allocate(self) -> None:
        """Build the execution plan with each local replica's variables (DESIGN decision 6; a
        sharded variable, transforms/rts.py, only its replica's shard) and the run tables."""
        program = self.program
        rf = program.replication_factor
        self._allocated = True  # set first: the reads below must not come back here
        try:
            self.plan = ExecutionPlan(
                program.graph, keep=[a.id for a in program.anchors] + list(program.persistent),
                order=program.schedule, num_stages=program.num_stages)
            self.plan.add_replicas(rf)
            with torch.no_grad():
                for tensor_id, sharding in self._sharded.items():
                    self._write_shards(tensor_id, sharding, self.plan.get_value(tensor_id))
                self._write_all_groups()  # replica-grouped variables: each its group's value
            self._input_slots = [self.plan.slot[i.id] for i in program.inputs]
            self._zero_inputs = [zeros_of(i.info) for i in program.inputs]
            self._actions, self._accumulators = anchor_actions(program, self.plan.slot)
            window = program.accumulation_factor * rf
            self._outer_steps = self.plan.outer_steps if program.has_outer_fragment else None
            # Micro-batch k ends an accumulation window (then the outer fragment runs).
            self._window_end = [k % window == window - 1
                                for k in range(program.micro_batches_per_run)]
            seed_slot = (self.plan.slot[program.random_seed_id]
                         if program.random_seed_id is not None else None)
            self._seeds = ([values[seed_slot] for values in self.plan.replica_values]
                           if seed_slot is not None else None)
            for seed_tensor, seed in zip(self._seeds or (), self._replica_seeds):
                seed_tensor[0] = seed
            state = self.plan.written_state_slots(
                [*program.persistent,
                 *([program.random_seed_id] if program.random_seed_id else [])])
            self._state = StateSnapshot(self.plan, state)
            self._own_slots = self._result_slots(state)
            self._tail = self._update_tail()
            table = tensor_input_table(program)
            self._tensor_inputs = (table, {s.id: 0 for s in program.inputs}) if table else None
        except BaseException:
            for name in SimulatedDevice._STORAGE:
                self.__dict__.pop(name, None)
            self._allocated = False
            raise

    def _update_tail(self) -> UpdateTail | None:
        """The trailing SGD updates ``_run_one`` runs fused after the anchor writes
        (device/update_tail.py), for a run of one micro-batch without an outer fragment."""
        program, plan = self.program, self.plan
        if (program.micro_batches_per_run != 1 or program.has_outer_fragment
                or program.num_stages or self.synthetic != "off"):
            return None
        held = {action[1] for actions in self._actions for action in actions}
        held |= {plan.slot[t] for t in program.persistent if t in plan.slot}
        held |= plan.pinned_slots
        return UpdateTail.of(plan.normal_steps, held)

    def _result_slots(self, state) -> frozenset[int]:
        """Slots whose value a run may hand over to a step IO (``stream_io.HandOver``): outputs
        of Normal-fragment ops that are not device state, nor read by another fragment after
        the micro-batch (so a slot cleared after the handover is written before it is read)."""
        program, plan = self.program, self.plan
        if program.has_outer_fragment or program.num_stages:
            return frozenset()
        slots = {s for step in plan.normal_steps
                 for s in ((step[2],) if step[3] else step[2]) if s >= 0}
        held = {plan.slot[t] for t in (*plan.stream_ids, *plan.variable_ids)}
        # A pinned slot matters only where a step writes it in place (the journal copies it);
        # an anchor that a Reshape merely views is still a fresh result of each run.
        return frozenset(slots - held - set(state) - (plan.pinned_slots & plan.inplace_slots))

    # --- weights ------------------------------------------------------------------------------

    def write_weights(self, values: dict[str, np.ndarray]) -> None:
        """Host -> device for the given weights (shapes and dtypes already checked), on every
        local replica; a sharded variable is split and each replica gets its shard."""
        slots, values = self.plan.slot, self._write_grouped(values)
        with torch.no_grad():
            for tensor_id, array in values.items():
                value = to_torch(array)
                sharding = self._sharded.get(tensor_id)
                if sharding is not None:
                    self._write_shards(tensor_id, sharding, value)
                    continue
                for replica in self.plan.replica_values:
                    replica[slots[tensor_id]].copy_(value)

    def _write_shards(self, tensor_id: str, sharding, full: torch.Tensor) -> None:
        """Each local replica's slot gets its own shard of ``full``."""
        shards = sharding.layout.split(full)
        slot = self.plan.slot[tensor_id]
        for r, replica in enumerate(self.plan.replica_values):
            replica[slot] = shards[sharding.shard_index(self.comm.offset + r)].clone()

    def read_weights(self, ids, replica: int = 0) -> dict[str, np.ndarray]:
        """Device -> host copies of the given weights of local ``replica`` (the replicas of a
        training session hold equal weights, as their gradients are all-reduced). A sharded
        variable is joined from the shards of the replica's group, pads dropped."""
        values, slots = self.plan.replica_values[replica], self.plan.slot
        out = self._read_grouped(ids)  # replica-grouped: each group's first replica
        for tensor_id in (i for i in ids if i not in out):
            sharding = self._sharded.get(tensor_id)
            if sharding is None:
                out[tensor_id] = to_host(values[slots[tensor_id]]).copy()
                continue
            # rts.py keeps shard groups inside one instance, so all are local.
            group = sharding.group_of(self.comm.offset + replica)
            shards = [self.plan.replica_values[r - self.comm.offset][slots[tensor_id]]
                      for r in group]
            out[tensor_id] = to_host(sharding.layout.join(shards, sharding.full_info.shape))
        return out

    def set_seed(self, seed: int) -> None:
        """Seed synthetic data and seeded ops; restarts the micro-batch counter."""
        self._generator.manual_seed(seed)
        self._micro_batch_counter = 0
        self._replica_seeds = [seed] * len(self._replica_seeds)
        self._counter_offsets = [0] * len(self._counter_offsets)
        for seed_tensor in (self._seeds or ()) if self._allocated else ():
            seed_tensor[0] = seed

    def rng_state(self) -> list[int]:
        """[seed, counter] of each local replica, concatenated: the randomSeed___ value its
        next micro-batch will draw with. Seeded ops derive every draw from that value (and
        their own fixed offset), so these numbers fix every future random draw. Synthetic
        input data (syntheticDataMode RandomNormal) has its own generator and is not part of
        the state."""
        state = []
        for r, (seed, offset) in enumerate(zip(self._replica_seeds, self._counter_offsets)):
            state += [seed, self._micro_batch_counter + r + offset]
        return state

    def set_rng_state(self, state: list[int]) -> None:
        """Restore a state of ``rng_state()`` (same number of local replicas), so the next
        runs draw what they drew after it was taken. Raises popart_exception."""
        replicas = len(self._replica_seeds)
        if len(state) != 2 * replicas:
            raise popart_exception(
                f"setRNGState: the state has {len(state)} values, but this session's RNG state "
                f"holds 2 values (seed, micro-batch counter) for each of its {replicas} local "
                f"replica(s), {2 * replicas} in all. Pass a state returned by getRNGState() of a "
                f"session with the same replication factor."
            )
        counter = state[1]
        self._micro_batch_counter = counter
        self._replica_seeds = [state[2 * r] for r in range(replicas)]
        self._counter_offsets = [state[2 * r + 1] - counter - r for r in range(replicas)]
        for seed_tensor, seed in zip((self._seeds or ()) if self._allocated else (),
                                     self._replica_seeds):
            seed_tensor[0] = seed

    # --- running ------------------------------------------------------------------------------

    def run(self, stepio) -> None:
        """Execute bps × af × rf micro-batches, reading and writing ``stepio``. All or nothing:
        when it raises, the device state it can write (``StateSnapshot``), the RNG state and
        the step IO offsets are as before the call (the anchors may be partly written)."""
        self._state.save()
        counter = self._micro_batch_counter
        generator = self._generator.get_state() if self.synthetic.startswith("random") else None
        try:
            self._run(stepio)
        except BaseException:
            self._state.restore()
            self._micro_batch_counter = counter
            if generator is not None:
                self._generator.set_state(generator)
            raise
        self._state.commit()

    def _run(self, stepio) -> None:
        if self.program.micro_batches_per_run < 2:
            # No bar is drawn for one micro-batch (min_total below): skip its setup, which
            # costs as much as a small model's kernel.
            self._execute = self._execute_replicas
            if (type(stepio) is PyStepIO and self.synthetic == "off"
                    and not self.program.num_stages):
                self._run_one(stepio)
            else:
                self._dispatch(stepio)
            return
        with progress.track("run", self.program.micro_batches_per_run, "micro-batch",
                            min_total=2) as bar:
            self._execute = self._counting_execute(bar)
            self._dispatch(stepio)

    def _execute_replicas(self, steps=None, group=None) -> None:
        """Run ``steps`` (default: the Normal fragment) on the local replicas ``group``
        (default: all; a subset only for steps without collectives)."""
        plan = self.plan
        plan.execute_replicas(plan.normal_steps if steps is None else steps, self.comm, group)

    def _counting_execute(self, bar):
        """The replicas' executor; with a progress bar, one that counts micro-batches (runs of
        the Normal fragment, or of the last pipeline stage), so the loops pay nothing when off."""
        execute = self._execute_replicas
        if bar is None:
            return execute
        last_stage = self.plan.stage_steps[-1] if self.plan.stage_steps else None
        replicas = self.program.replication_factor

        def counted(steps=None, group=None):
            execute(steps, group)
            if steps is None or steps is last_stage:
                bar.update(replicas if group is None else len(group))

        return counted

    def _dispatch(self, stepio) -> None:
        if not isinstance(stepio, (PyStepIO, PyStepIOCallback)):
            raise StepIOError(
                f"run() needs a PyStepIO or PyStepIOCallback, got {type(stepio).__name__}."
            )
        if self.program.num_stages:
            self._run_pipelined(stepio)
        else:
            self._run_micro_batches(stepio)

    def _synthetic_feeds(self) -> list[list[torch.Tensor]] | None:
        total = self.program.micro_batches_per_run
        if self.synthetic == "zeros":
            return [[zero] * total for zero in self._zero_inputs]
        if self.synthetic in ("random_normal", "random_uniform"):
            feeds = []
            for stream, zero in zip(self.program.inputs, self._zero_inputs):
                if stream.info.dtype is DataType.STRING:
                    feeds.append([zero] * total)  # no random strings: ""
                    continue
                shape = (total, *stream.info.shape)
                if self.synthetic == "random_normal":
                    values = torch.randn(shape, generator=self._generator)
                else:  # U(-1, 1), converted to the input's type like the normal draw
                    values = torch.rand(shape, generator=self._generator).mul_(2.0).sub_(1.0)
                feeds.append(values.to(stream.info.dtype.torch).unbind(0))
            return feeds
        return None

    def _bind(self, stepio):
        """(feeds per input or None for callbacks, host destinations or None, offsets)."""
        p = self.program
        feeds = self._synthetic_feeds()
        in_offsets, out_offsets, destinations = {}, {}, None
        if isinstance(stepio, PyStepIO):
            if feeds is None:
                feeds, in_offsets = bind_inputs(p, stepio)
            destinations, out_offsets = bind_outputs(p, stepio)
        elif feeds is None and p.replication_factor > 1 and any(s.broadcast for s in p.inputs):
            raise StepIOError(
                f"Inputs {[s.id for s in p.inputs if s.broadcast]} are broadcast to every "
                f"replica (ReplicatedStreamMode.Broadcast), which a PyStepIOCallback cannot "
                f"feed here: its callbacks give one value per replica. Use a PyStepIO.")
        return feeds, destinations, (in_offsets, out_offsets)

    @staticmethod
    def _commit_offsets(stepio, offsets) -> None:
        # Offsets move only after a complete run, so a failed run leaves the step IO as it was.
        if isinstance(stepio, PyStepIO):
            stepio.input_offsets.update(offsets[0])
            stepio.output_offsets.update(offsets[1])

    def _run_one(self, stepio: PyStepIO) -> None:
        """``_run_micro_batches`` for its most common case, a single micro-batch on a single
        replica from a PyStepIO (an inference call, a training step), without its loops."""
        p = self.program
        fast = self._tensor_inputs
        tensors = bind_tensor_inputs(fast[0], stepio) if fast is not None else None
        if tensors is not None:  # torch inputs of the right types and shapes, read in place
            in_offsets = fast[1]
        else:
            feeds, in_offsets = bind_inputs(p, stepio)
            tensors = [chunks[0] for chunks in feeds]
        destinations, out_offsets = bind_outputs(p, stepio)
        values = self.plan.values
        for slot, tensor in zip(self._input_slots, tensors):
            values[slot] = tensor
        if self._seeds is not None:
            self._seeds[0][1] = self._micro_batch_counter + self._counter_offsets[0]
            self._micro_batch_counter += 1
        with DeviceMode():
            tail = self._tail
            if tail is None:
                self._execute_replicas()
            else:
                self._execute_replicas(tail.body)
                update = tail.bind(values)
                if update is None:  # the updates differ in hyper-parameters: steps as usual
                    self._execute_replicas(tail.steps)
            if self._actions[0]:
                self._emit(self._actions[0], destinations, stepio, values)
            if tail is not None and update is not None:
                update()  # in place, last: nothing after it can fail (device/update_tail.py)
            if self._outer_steps is not None and self._window_end[0]:
                self._execute_replicas(self._outer_steps)
        self._commit_offsets(stepio, (in_offsets, out_offsets))

    def _run_micro_batches(self, stepio) -> None:
        """Unpipelined: micro-batch by micro-batch, then the outer fragment at the end of each
        accumulation window. Replicas run one after the other, unless the Normal fragment has a
        collective: then they run in lockstep (every replica's micro-batch (b, a), each up to
        the collective, the collective, and so on), as their IPUs do."""
        p = self.program
        feeds, destinations, offsets = self._bind(stepio)
        rf = p.replication_factor
        replicas = self.plan.replica_values
        lockstep = rf > 1 and self.plan.has_collective(self.plan.normal_steps)
        groups = [tuple(range(rf))] if lockstep else [(r,) for r in range(rf)]
        slots_feeds = list(zip(self._input_slots, feeds)) if feeds is not None else None
        streams = list(zip(self._input_slots, p.inputs))
        actions, seeds, counter_offsets = self._actions, self._seeds, self._counter_offsets
        execute = self._execute
        outer, window_end = self._outer_steps, self._window_end
        with DeviceMode():
            for base in range(0, p.micro_batches_per_run, rf):
                for group in groups:
                    for r in group:
                        values = replicas[r]
                        if slots_feeds is not None:
                            for slot, chunks in slots_feeds:
                                values[slot] = chunks[base + r]
                        else:
                            for slot, stream in streams:
                                value = callback_input(
                                    stream, stepio.input_callback(stream.id, False))
                                # In lockstep the next replica's callbacks come first: keep a
                                # copy, the user may reuse the buffer once it is complete.
                                values[slot] = value.clone() if lockstep else value
                                if lockstep:
                                    stepio.input_complete_callback(stream.id)
                        if seeds is not None:
                            seeds[r][1] = self._micro_batch_counter + counter_offsets[r]
                            self._micro_batch_counter += 1
                    execute(None, group)
                    for r in group:
                        if slots_feeds is None and not lockstep:
                            for stream in p.inputs:
                                stepio.input_complete_callback(stream.id)
                        if actions[base + r]:
                            self._emit(actions[base + r], destinations, stepio, replicas[r])
                if outer is not None and window_end[base + rf - 1]:
                    execute(outer)
        self._commit_offsets(stepio, offsets)

    def pipeline_cycles(self) -> list[list[tuple[int, int]]]:
        """Per cycle of one pipeline run, the (stage, micro-batch within the run) pairs it
        executes, in execution order."""
        p = self.program
        stages, depth = p.num_stages, p.pipeline_depth
        return [[(s, c - s) for s in range(stages) if s <= c < s + depth]
                for c in range(depth + stages - 1)]

    def _run_pipelined(self, stepio) -> None:
        p = self.program
        feeds, destinations, offsets = self._bind(stepio)
        bps, af, rf = p.batches_per_step, p.accumulation_factor, p.replication_factor
        accumulated = p.windowed  # accumulation windows (training, or its forward-only program)
        windows = bps if accumulated else 1
        plan, replicas, seeds = self.plan, self.plan.replica_values, self._seeds
        execute = self._execute
        stage_inputs = [[(self._input_slots[i], i) for i, st in enumerate(p.input_stages)
                         if st == s] for s in range(p.num_stages)]
        stage_actions = [[[a for a in self._actions[k] if p.anchor_stages[a[2]] == s]
                          for s in range(p.num_stages)] for k in range(p.micro_batches_per_run)]
        cycles = self.pipeline_cycles()
        seed_base, counter_offsets = self._micro_batch_counter, self._counter_offsets
        with torch.inference_mode(False), torch.no_grad():
            for w in range(windows):
                for cycle in cycles:
                    for s, i in cycle:
                        # Micro-batch k = (b·af + a)·rf + r of the run (see module doc); the
                        # replicas run each stage in lockstep, as their IPUs do.
                        base = ((w * af + i) if accumulated else i * af) * rf
                        for r, values in enumerate(replicas):
                            for slot, index in stage_inputs[s]:
                                if feeds is not None:
                                    values[slot] = feeds[index][base + r]
                                    continue
                                value = callback_feed(stepio, p.inputs[index])
                                # The user may reuse the buffer for the next replica's call.
                                values[slot] = value.clone() if rf > 1 else value
                            if seeds is not None:
                                seeds[r][1] = seed_base + base + r + counter_offsets[r]
                        execute(plan.stage_steps[s])
                        for r, values in enumerate(replicas):
                            if stage_actions[base + r][s]:
                                self._emit(stage_actions[base + r][s], destinations, stepio,
                                           values)
                    for s, _ in reversed(cycle):
                        execute(plan.copy_steps[s])
                if self._outer_steps is not None:
                    execute(self._outer_steps)
        self._micro_batch_counter = seed_base + p.micro_batches_per_run
        self._commit_offsets(stepio, offsets)

    def _emit(self, actions, destinations, stepio, values) -> None:
        """Apply one micro-batch's anchor writes from one replica's slots ``values`` (to host
        arrays, or through callbacks)."""
        accumulators, own = self._accumulators, self._own_slots
        for kind, source, index, j in actions:
            if kind == _COPY and destinations is not None:
                destination = destinations[index][j]
                if type(destination) is HandOver and source in own:
                    destination.take(values, source)  # the result itself, if nothing holds it
                else:
                    destination.copy_(values[source])
                continue
            value = values[source]
            if kind == _ACC_SET:
                accumulators[index][j].copy_(value)
                continue
            if kind == _ACC_ADD:
                accumulators[index][j].add_(value)
                continue
            if kind == _ACC_FLUSH:
                accumulators[index][j].add_(value)
                value = accumulators[index][j]
            if destinations is not None:
                destinations[index][j].copy_(value)
                continue
            anchor = self.program.anchors[index]
            array = stepio.output_callback(anchor.id)
            callback_output(anchor, array).copy_(value)
            stepio.output_complete_callback(anchor.id)
