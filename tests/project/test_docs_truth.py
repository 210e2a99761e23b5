"""README.md and docs/ say what the code does: flags, choices, defaults, variables, paths, module
names, output files and their writers, checked against the code (docs_truth); the statements
that once said otherwise are caught when fed back in."""
import pytest

import docs_truth
from docs_truth import CONTRADICTED, PAGES, problems


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_the_page_states_only_what_the_code_does(page):
    assert problems(page.read_text()) == []


# Statements these pages once made, each false: the check that catches it, by the words of its problem.
ONCE_FALSE = {
    "writes the progress line and metrics.jsonl":
        ("`minidl/training/outputs.py:RunOutputs.steps` writes the progress line and `metrics.jsonl`\n"
         "(rank 0 only)", "does not write metrics.jsonl"),
    "backward in reverse creation order":
        ("`minidl/autograd.py:Tensor.backward`, which walks the tape from the loss in reverse creation\n"
         "order", "by generation"),
    "scale --lr by N·b/256": ("Goyal et al.: scale `--lr` by N·b/256", "already scales --lr"),
    "kernels/conv.py": ("one launcher module per source (`kernels/conv.py` ↔ `kernels/conv.cu`)", "kernels/conv.py"),
    "one contiguous buffer":
        ("`SGD(params, ...)` copies every parameter into one contiguous buffer and makes each\n"
         "parameter's `.data` and `.grad` views into it", "two buffers"),
    "one OS thread per CUDA thread": ("one OS thread per CUDA thread of a block", "fibers"),
    "std::barrier": ("`__syncthreads` as a `std::barrier` per block", "std::barrier"),
    "atomics under a lock": ("per-warp barrier and an exchange slot per thread, atomics under a lock", "no lock"),
    "no includes": ("no host code, no includes beyond CUDA's own headers", "includes"),
    "bf16 later": ("compute dtype a policy (fp32 first, bf16\n  on GPU later)", "--amp"),
    "native and ring columns": ("| MiB | native (MPICH) ms | ring | hierarchical | torus2d 2×4 |", "same call"),
    "--recipe goyal|sony": ("1. a recipe (`--recipe goyal|sony`): the papers' hyper-parameters;", "sony122"),
    "MINIDL_CACHE": ("`MINIDL_CACHE`: where the embedded dataset is generated (default: ~/.cache/minidl)",
                     "autotuner"),
}


@pytest.mark.parametrize("statement, expected", ONCE_FALSE.values(), ids=ONCE_FALSE.keys())
def test_a_statement_once_false_is_caught(statement, expected):
    found = problems(statement)
    assert len(found) == 1 and expected in found[0], found


# Other mistakes of each class the checks read.
WRONG = {
    "a flag no command has": "`--no-such-flag`",
    "a trainer flag given to a benchmark": "`python -m minidl.bench step --torus-shape 2x2`",
    "a benchmark's flag given to the trainer": "```bash\nmpiexec -n 4 python -m mpi4py train.py --sizes-mb 1\n```",
    "a value outside the choices": "`--allreduce butterfly`",
    "choices in a table cell that miss one": "| `--lr-scheduler step\\|poly\\|cosine` | decay after warmup |",
    "a wrong default": "`--collective-timeout SECONDS` (default 60 s)",
    "an unknown variable": "set `MINIDL_NO_SUCH` to 1",
    "a module that is not there": "`minidl.training.no_such_module`",
    "a name the module lacks": "`minidl.distributed.NoSuchReducer`",
    "a bare source file that is not there": "see `conv_v9.cu`",
    "a function a derivation points at that is not there": "(`minidl/ops/norm.py:no_such_gradient`)",
    "an output file nothing writes": "the run writes `epochs.jsonl`",
    "a variables table missing one": "| `MINIDL_DEVICE` | cpu or gpu |",
}


@pytest.mark.parametrize("statement", WRONG.values(), ids=WRONG.keys())
def test_a_wrong_statement_of_each_class_is_caught(statement):
    assert len(problems(statement)) >= 1


RIGHT = [
    "`--recipe goyal|sony|sony122`", "`--allreduce torus2d`", "`--collective-timeout SECONDS` (default 600 s)",
    "`python -m minidl.bench allreduce --sizes-mb 1,10 --repeat 5`", "`minidl-plan --world-size 1024 --recipe goyal`",
    "```bash\nmpiexec -n 4 --oversubscribe python -m mpi4py train.py --allreduce ring --no-fuse\n```",
    "`minidl/training/outputs.py:RunOutputs.steps` writes a line of `steps.jsonl`",
    "`minidl.distributed.GradientReducer`, `MINIDL_NUM_THREADS`, `kernels/conv_v2.cu`, `summary.json`",
]


@pytest.mark.parametrize("statement", RIGHT)
def test_a_true_statement_passes(statement):
    assert problems(statement) == []


@pytest.mark.parametrize("fact", [fact for _, fact, _ in CONTRADICTED], ids=lambda fact: fact.__name__)
def test_each_pinned_statement_is_still_false(fact):
    """Where the code changes so that a pinned statement becomes true, its entry goes."""
    assert fact()


def test_a_page_is_read_whole():
    assert len(docs_truth.code_lines((PAGES[0]).read_text())) > 50
