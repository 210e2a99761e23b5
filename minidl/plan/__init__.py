"""The time-to-train simulator: how long a training run would take on many GPUs of a machine.

`python -m minidl.plan` (`minidl-plan`) simulates a whole run from the engine's own pieces: the
batch of each epoch from its schedule, the buckets from the gradient reducer's cut of the real
model's flat buffer, each bucket's all-reduce stages from the all-reduce's own plan (on a
communicator that records instead of sending), the torus grid from its chooser, and every
collective priced by the alpha-beta cost model on the links of a machine file.

Details: docs/plan.md.
"""
