"""`--list`: the runs of part 1 and part 6 a study would make, and where each finished one is kept,
read in a second without training anything (parts 2-5's rows follow the B* part 1 gives)."""
from pathlib import Path

from minidl.experiments.large_batch import protocol
from minidl.experiments.large_batch.rows import batch_rows, protocol_cells, protocol_row, protocol_tuning_rows
from minidl.experiments.large_batch.runs import finished

WHERE = {"folder": "done (run folder)", "store": "done (store)", None: "to train"}


def listing(design, selected, output_dir, cache_dir, store=None):
    """The runs as text: a line per run, and a count per group."""
    data = Path(cache_dir) / design.dataset_name  # where the study makes its data; not needed to look a run up
    found = {}  # (row, seed) -> (where, result)

    def group(title, pairs, later=()):
        """`pairs` (row, seed) looked up; `later` the lines of runs whose rate the tuning has not given yet."""
        found.update({(row, seed): finished(row, seed, design, data, output_dir, store) for row, seed in pairs})
        done = sum(found[pair][0] is not None for pair in pairs)
        lines = [f"{title}: {len(pairs) + len(later)} runs, {done} done"]
        lines += [f"  {row.name}, seed {seed}: {WHERE[found[row, seed][0]]}" for row, seed in pairs]
        return lines + [f"  {line}" for line in later]

    lines = group(f"part 1, seeds {', '.join(map(str, design.batch_seeds))}",
                  [(row, seed) for seed in design.batch_seeds for row in batch_rows(design)])
    if 6 in selected:
        tuning = [(row, design.tuning_seed) for row in protocol_tuning_rows(design)]
        lines += group(f"part 6, tuning on seed {design.tuning_seed}", tuning)
        title = f"part 6, seeds {', '.join(map(str, design.seeds))} at each row's best rate"
        if all(found[pair][0] is not None for pair in tuning):
            best = protocol.best_rates(design, {pair: found[pair][1] for pair in tuning})
            reported = [(row, seed) for row in protocol.reported_rows(design, best) for seed in design.seeds]
            lines += group(title, reported)
        else:
            reported = [(protocol_row(batch, opt, None), seed) for batch, opt in protocol_cells(design)
                        for seed in design.seeds]
            lines += group(title, [], [f"{row.name}, seed {seed}: to train, at the rate the tuning picks"
                                       for row, seed in reported])
        done = sum(found.get(pair, (None,))[0] is not None for pair in tuning + reported)
        lines.append(f"part 6 in all: {len(tuning) + len(reported)} runs, {done} done")
    return "\n".join(lines) + "\n"
