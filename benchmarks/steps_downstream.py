"""The sampler's steps path after the records are read, per tick of alike steps (issue 39).

    python benchmarks/steps_downstream.py --steps 1000 --ticks 30

A tick of ``--steps`` steps of one record each (phases and loss folded in, as a fast loop makes
them) is fed to a ``StepAssembler``; then, timed in thread CPU (medians over the ticks): the
rows taken and stored as the pipeline's collect does (``take``, the column cap,
``RunModel.add_step_rows``: store, span log, outbox), the outbox taken and written by an
in-process run log (its encoding, what the run log's worker does before the writer process
starts), and the pickling of that batch for the writer process. Also the memory blocks still
alive from take+store+take_batch (``tracemalloc``, the batch held): a dict per row shows there.
It runs on whichever nbmonitor is imported, so a tree from before a change can be timed against
one from after it (``PYTHONPATH``), alternated.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import tracemalloc

from nbmonitor._engine.assemble.steps import StepAssembler
from nbmonitor._engine.column_cap import ColumnCap
from nbmonitor._engine.run_model import RunModel
from nbmonitor.records import PHASES, StepRecord
from nbmonitor.sinks import RunLogSink, writer


def records(first: int, last: int) -> list[StepRecord]:
    return [
        StepRecord(
            step=s,
            time=1000.0 + s * 0.01,
            step_time=0.01 + (s % 7) * 1e-4,
            samples=8,
            micro_batches=1,
            lrs=(1e-3,),
            phases=tuple(0.001 * (i + 1) + s * 1e-7 for i in range(len(PHASES))),
            loss=1.0 / s + (s % 13) * 1e-3,
        )
        for s in range(first, last + 1)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000, help="steps a tick")
    parser.add_argument("--ticks", type=int, default=30, help="ticks timed (after 3 warm-up)")
    args = parser.parse_args()
    assembler, model, cap = StepAssembler(), RunModel(), ColumnCap()
    model.outbox.open()
    sink = RunLogSink.create(tempfile.mkdtemp(), "steps-downstream", {})
    taken, written, pickled, blocks = [], [], [], []
    step = 1
    for tick in range(args.ticks + 3):
        batch_records = records(step, step + args.steps - 1)
        step += args.steps
        for _ in assembler.feed(batch_records):
            pass
        traced = tick == 2
        if traced:
            tracemalloc.start()
        t0 = time.thread_time()
        for part in assembler.take():
            if part.columns is None:
                kept, columns = cap.filter(part.rows), None
            else:
                kept, columns = cap.filter_columns(part.rows, part.columns)
            model.add_step_rows(kept, columns, logged=part.rows)
        t1 = time.thread_time()
        batch = model.take_batch()
        if traced:
            stats = tracemalloc.take_snapshot().statistics("filename")
            tracemalloc.stop()
            blocks.append(sum(s.count for s in stats))
        t2 = time.thread_time()
        sink.write(batch)
        sink.flush()
        t3 = time.thread_time()
        writer.dumps(("write", dict(batch.streams)))
        t4 = time.thread_time()
        if tick >= 3:
            taken.append(t1 - t0)
            written.append(t3 - t2)
            pickled.append(t4 - t3)
    sink.close()

    def ms(values: list[float]) -> str:
        return f"{statistics.median(values) * 1e3:.2f} ms"

    print(
        f"{args.steps} steps a tick: take+store {ms(taken)}, run log in process (encode, "
        f"write, flush) {ms(written)}, writer process pickle {ms(pickled)}; memory blocks "
        f"alive after take+store+take_batch: {blocks[0]}"
    )


if __name__ == "__main__":
    main()
