"""The parts the training loop (minidl.trainer) is made of, one job each:

    build        the schedule, model and optimizer a configuration asks for
    parts        what the loop runs around each step, each with its trigger (watchdog, trace
                 window, progress and logging, --checkpoint-every)
    steps        the step interface: EagerStep, GraphedTrainStep (CUDA graph replay)
    device_step  the whole step on the device, what a graph captures; graph: the capture itself
    forward      the forward pass and loss of a batch
    evaluator    validation over all ranks, with the BN-statistics averaging
    state        the run's state as a checkpoint, and its restore; position: where a run is
    outputs      config/metrics/steps/summary files, banner, progress bar
    timer        where a step's time goes; preemption: SIGTERM/SIGINT as a stop request
    trace        --trace-steps: the window of traced steps; recorder: one rank's timeline;
                 chrome_trace: the ranks' timelines as one Chrome Trace Event file
"""
