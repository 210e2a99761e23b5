"""Part 6: LARS and SGD under You et al.'s protocol (2017, arXiv 1708.03888).

Every row warms up linearly from its own rate for the design's warmup epochs, then decays as
(1 − progress)^2 to zero at the last epoch. The base rate is retuned for each batch and
optimizer: every rate of the optimizer's grid trains once on the tuning seed (not reported), the
lowest final error picks the rate, and the reported seeds train at it. B* of each optimizer is the
study's rule applied to the reference row (SGD at k·n = N) followed by that optimizer's rows;
LARS moves B* if its B* is larger than SGD's, by the ratio of the two.
"""
from minidl.experiments.large_batch import report
from minidl.experiments.large_batch.rows import N, protocol_cells, protocol_rates, protocol_row, protocol_tuning_rows

OPTIMIZER_NAMES = {"sgd": "SGD", "lars": "LARS"}


def run(design, results, train):
    """The tuning, then the reported seeds at each pair's best rate; `train(pairs)` puts the result of
    each (row, seed) it is given into `results`. Returns the best rates, {(batch, optimizer): rate}."""
    tuning = [(row, design.tuning_seed) for row in protocol_tuning_rows(design)]
    train([pair for pair in tuning if pair not in results])
    best = best_rates(design, results)
    reported = [(row, seed) for row in reported_rows(design, best) for seed in design.seeds]
    train([pair for pair in reported if pair not in results])
    return best


def best_rates(design, results):
    """{(batch, optimizer): the rate of its grid with the lowest error on the tuning seed} (the first
    of equal ones)."""
    def error(batch, opt, rate):
        return results[protocol_row(batch, opt, rate), design.tuning_seed]["val_error"]
    return {(batch, opt): min(protocol_rates(design, opt), key=lambda rate: error(batch, opt, rate))
            for batch, opt in protocol_cells(design)}


def reported_rows(design, best):
    return [protocol_row(batch, opt, best[batch, opt]) for batch, opt in protocol_cells(design)]


def by_optimizer(view):
    """{optimizer: the reference row (k·n = N) and the optimizer's rows} of `view`, {row: [result per
    seed]} of the reported rows."""
    return {opt: {row: runs for row, runs in view.items() if row.batch == N or row.opt == opt}
            for opt in OPTIMIZER_NAMES}


def b_stars(view):
    """{optimizer: B*} by the study's rule over the reference row followed by the optimizer's rows."""
    return {opt: report.critical_batch(report.points(rows)) for opt, rows in by_optimizer(view).items()}


def verdict(b_star):
    """The design's verdict rule, one sentence, from {optimizer: B*}."""
    sgd, lars = b_star["sgd"], b_star["lars"]
    if lars > sgd:
        return f"LARS moves B* from {sgd} to {lars} (×{lars / sgd:g}) under You et al.'s protocol"
    return f"LARS does not move B* under You et al.'s protocol: {lars} with LARS, {sgd} with SGD"


def tuning_table(design, results):
    """The tuning seed's error at each rate of each (batch, optimizer) pair, the lowest marked."""
    best = best_rates(design, results)
    lines = [f"| k·n | optimizer | val error (%) on seed {design.tuning_seed} at each η per {N} | best η |",
             "|---|---|---|---|"]
    for batch, opt in protocol_cells(design):
        errors = ", ".join(f"{rate:g}: {results[protocol_row(batch, opt, rate), design.tuning_seed]['val_error']:.2f}"
                           for rate in protocol_rates(design, opt))
        lines.append(f"| {batch} | {OPTIMIZER_NAMES[opt]} | {errors} | {best[batch, opt]:g} |")
    return "\n".join(lines)
