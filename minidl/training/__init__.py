"""The parts the training loop (minidl.trainer) is made of, one job each: build (schedule,
model, optimizer), parts (what runs around each step), steps, device_step and graph (the
step, eager or CUDA-graph), forward, evaluator, state and position (checkpoints, where a run
is), outputs (files, progress bar), timer and preemption, trace, recorder and chrome_trace
(--trace-steps timelines).

Details: docs/training.md, "minidl/training/__init__.py".
"""
